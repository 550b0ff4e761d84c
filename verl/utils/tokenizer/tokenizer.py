"""Loading Hugging Face tokenizers and processors the way veRL does (``verl.utils.tokenizer``; also
``from verl.utils import hf_tokenizer, hf_processor``), and reading token ids out of whatever a tokenizer returns."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

__all__ = ["hf_processor", "hf_tokenizer", "normalize_token_ids", "set_pad_token_id"]

# the package's name, so that the warnings keep the logger they had before the module became a package
logger = logging.getLogger("verl.utils.tokenizer")

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


def _as_token_id(token: Any, position: int) -> int:
    """One token id: an int, or an integer scalar with ``.item()`` (numpy / 0-d torch); TypeError otherwise."""
    if hasattr(token, "item") and not isinstance(token, int):
        token = token.item()
    if isinstance(token, bool) or not isinstance(token, int):
        raise TypeError(f"token_ids[{position}]={token!r:.80} ({type(token).__name__}) is not an integer token id")
    return token


def normalize_token_ids(tokenized_output: Any) -> list[int]:
    """A flat ``list[int]`` from what ``tokenizer(...)`` / ``apply_chat_template(tokenize=True)`` returns under
    transformers 4 or 5: a list or tuple of ids, anything with ``.tolist()`` (ndarray, tensor), a mapping or
    ``BatchEncoding`` with ``input_ids``, or a batch of exactly one row (``[[...]]``).

    Raises TypeError for anything else: a string, a mapping without ``input_ids``, a batch of several rows
    (ambiguous), or an element that is not an integer (floats are refused rather than truncated)."""
    token_ids = tokenized_output
    if isinstance(token_ids, Mapping):
        if "input_ids" not in token_ids:
            raise TypeError(f"a mapping without 'input_ids' (keys {list(token_ids)[:5]}) holds no token ids")
        token_ids = token_ids["input_ids"]
    elif hasattr(token_ids, "input_ids") and not isinstance(token_ids, str | bytes):
        token_ids = token_ids.input_ids
    if hasattr(token_ids, "tolist"):
        token_ids = token_ids.tolist()
    if isinstance(token_ids, list | tuple) and len(token_ids) == 1 and isinstance(token_ids[0], list | tuple):
        token_ids = token_ids[0]
    if not isinstance(token_ids, list | tuple):
        raise TypeError(f"token ids must be a list of ints, got {type(token_ids).__name__}: {token_ids!r:.80}")
    if token_ids and isinstance(token_ids[0], list | tuple):
        raise TypeError(f"a batch of {len(token_ids)} rows of token ids is ambiguous; pass one row")
    return [_as_token_id(token, position) for position, token in enumerate(token_ids)]
