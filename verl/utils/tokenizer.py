"""Loading Hugging Face tokenizers and processors the way veRL does (``verl.utils.tokenizer``; also
``from verl.utils import hf_tokenizer, hf_processor``)."""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["hf_processor", "hf_tokenizer", "set_pad_token_id"]

logger = logging.getLogger(__name__)

_GEMMA2_IT = "gemma-2-2b-it"
_GEMMA2_EOS, _GEMMA2_EOS_ID = "<end_of_turn>", 107


def set_pad_token_id(tokenizer: Any) -> None:
    """Give ``tokenizer`` a pad token when it has none: its eos token (with a warning)."""
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token_id = tokenizer.eos_token_id
        logger.warning("tokenizer.pad_token_id is None; set to the eos token id %s", tokenizer.eos_token_id)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
        logger.warning("tokenizer.pad_token is None; set to the eos token %r", tokenizer.eos_token)


def hf_tokenizer(name_or_path: Any, correct_pad_token: bool = True, correct_gemma2: bool = True, **kwargs: Any):
    """``AutoTokenizer.from_pretrained(name_or_path, **kwargs)``, with a pad token (the eos token when missing,
    ``correct_pad_token``) and, for ``gemma-2-2b-it`` (``correct_gemma2``), ``<end_of_turn>`` as the eos token."""
    from transformers import AutoTokenizer

    if correct_gemma2 and isinstance(name_or_path, str) and _GEMMA2_IT in name_or_path:
        logger.warning("gemma-2-2b-it tokenizer: using eos_token=%r (id %d)", _GEMMA2_EOS, _GEMMA2_EOS_ID)
        kwargs["eos_token"] = _GEMMA2_EOS
        kwargs["eos_token_id"] = _GEMMA2_EOS_ID
    tokenizer = AutoTokenizer.from_pretrained(name_or_path, **kwargs)
    if correct_pad_token:
        set_pad_token_id(tokenizer)
    return tokenizer


def hf_processor(name_or_path: Any, **kwargs: Any):
    """``AutoProcessor.from_pretrained(name_or_path, **kwargs)`` for a multimodal model; None when the model has no
    processor (``AutoProcessor`` falls back to the plain tokenizer for text-only models, which is not returned)."""
    from transformers import AutoProcessor

    try:
        processor = AutoProcessor.from_pretrained(name_or_path, **kwargs)
    except Exception as e:  # text-only model folders often have no processor config at all
        logger.debug("no processor for %s: %s", name_or_path, e)
        return None
    if "Processor" not in type(processor).__name__:
        return None
    return processor
