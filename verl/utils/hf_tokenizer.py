"""``verl.utils.hf_tokenizer``: the tokenizer helpers of :mod:`verl.utils.tokenizer` under a second module path.

veRL code also does ``from verl.utils import hf_tokenizer`` and calls it. Importing this module makes Python set
the attribute ``verl.utils.hf_tokenizer`` to the module itself, which would shadow that function; so the module
object is callable too, and calling it calls :func:`verl.utils.tokenizer.hf_tokenizer`.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from verl.utils.tokenizer import hf_processor, hf_tokenizer, set_pad_token_id

__all__ = ["hf_processor", "hf_tokenizer", "set_pad_token_id"]


class _CallableModule(types.ModuleType):
    """This module, callable as :func:`hf_tokenizer`."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return hf_tokenizer(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
