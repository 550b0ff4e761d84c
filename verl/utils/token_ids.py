"""Token ids from what callers pass (lists, tensors, a tokenizer's ``BatchEncoding``), checked; light to import (no
torch), so that config validation in the driver can load the agent-loop modules."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np


def as_token_ids(value: Any, what: str = "prompt_ids") -> list[int]:
    """Token ids from what a caller may pass: a list or tensor of ints, a one-row nested list, or a tokenizer's
    ``BatchEncoding`` / mapping with ``input_ids`` (transformers 5's ``apply_chat_template(tokenize=True)``).
    Anything else is a ValueError naming ``what`` and the offending value."""
    if isinstance(value, Mapping) or (hasattr(value, "input_ids") and not isinstance(value, list | tuple)):
        if "input_ids" not in value:
            raise ValueError(f"{what}: a mapping without 'input_ids' (keys {list(value)[:5]}), not token ids")
        value = value["input_ids"]
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, list | tuple) and len(value) == 1 and isinstance(value[0], list | tuple):
        value = value[0]
    if not isinstance(value, list | tuple):
        raise ValueError(f"{what} must be a list of token ids, got {type(value).__name__}: {value!r:.80}")
    for position, token in enumerate(value):
        if isinstance(token, bool) or not isinstance(token, int | np.integer):
            raise ValueError(
                f"{what}[{position}]={token!r:.80} ({type(token).__name__}) is not a token id: pass a list of ints "
                "(a tokenizer's apply_chat_template(..., tokenize=True) result's input_ids)"
            )
    return [int(t) for t in value]
