"""Tokenizer helpers (veRL's ``verl.utils.tokenizer`` package): loading tokenizers and processors
(:mod:`.tokenizer`), flat token ids from any tokenizer output, and what a chat template puts around a turn
(:mod:`.chat_template`, imported on use)."""

from verl.utils.tokenizer.tokenizer import hf_processor, hf_tokenizer, normalize_token_ids, set_pad_token_id

__all__ = ["hf_processor", "hf_tokenizer", "normalize_token_ids", "set_pad_token_id"]
