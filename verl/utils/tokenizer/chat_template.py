"""What a chat template renders around a turn, found by rendering probe conversations.

A multi-turn rollout builds its token sequence turn by turn: the model's output (which ends at the turn's close
token, e.g. ``<|im_end|>``), then each tool or user turn rendered on its own with the template's system prompt cut
off. Two things must be known for that to equal ``apply_chat_template`` of the whole conversation:

* the **system prompt** the template puts before any message when none is given (cut from each turn rendered
  alone): :func:`initialize_system_prompt`;
* the **turn separator** the template writes after a turn's close token (``"\\n"`` in ChatML), which the model never
  emits and a turn rendered alone does not start with: :func:`initialize_turn_separator`.
"""

from __future__ import annotations

import logging
from typing import Any

from verl.utils.tokenizer.tokenizer import normalize_token_ids

__all__ = ["initialize_system_prompt", "initialize_turn_separator"]

logger = logging.getLogger(__name__)


def _render(tokenizer: Any, messages: list[dict[str, Any]], **apply_chat_template_kwargs: Any) -> list[int]:
    """Token ids of ``messages`` without a generation prompt."""
    kwargs = {**apply_chat_template_kwargs, "add_generation_prompt": False, "tokenize": True}
    return normalize_token_ids(tokenizer.apply_chat_template(messages, **kwargs))


def initialize_system_prompt(tokenizer: Any, **apply_chat_template_kwargs: Any) -> list[int]:
    """The tokens a chat template renders before the first message (its default system turn), [] if none.

    One empty user turn renders as ``system + turn`` and two as ``system + turn + turn``, so a turn is the length
    difference of the two renders and the system prompt is the first render less one turn at its end."""
    user = {"role": "user", "content": ""}
    one = _render(tokenizer, [user], **apply_chat_template_kwargs)
    two = _render(tokenizer, [user, user], **apply_chat_template_kwargs)
    turn_length = len(two) - len(one)
    if turn_length <= 0:
        logger.warning("chat template renders two turns no longer than one; assuming no system prompt")
        return []
    return one[: len(one) - turn_length]


def _eos_ids(tokenizer: Any) -> set[int]:
    """The eos token id(s) of a tokenizer, or of the tokenizer a processor wraps; an int or a list (Llama 3)."""
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        eos = getattr(getattr(tokenizer, "tokenizer", None), "eos_token_id", None)
    if eos is None:
        return set()
    return {eos} if isinstance(eos, int) else set(eos)


def _user_turn_pair(tokenizer: Any, **apply_chat_template_kwargs: Any) -> tuple[list[int], list[int]] | None:
    """One user turn rendered with an empty and with a one-word body: content as a string, else (multimodal
    processors, which index ``content`` as a list of typed parts) as a list with one text part; None if neither
    renders."""
    for empty, filled in (("", "x"), ([{"type": "text", "text": ""}], [{"type": "text", "text": "x"}])):
        try:
            return (
                _render(tokenizer, [{"role": "user", "content": empty}], **apply_chat_template_kwargs),
                _render(tokenizer, [{"role": "user", "content": filled}], **apply_chat_template_kwargs),
            )
        except Exception as e:  # noqa: BLE001 - a template or processor refusing this content form
            logger.debug("user-turn probe with content %r failed: %s", empty, e)
    return None


def initialize_turn_separator(tokenizer: Any, **apply_chat_template_kwargs: Any) -> list[int]:
    """The tokens a chat template writes after a turn's close token and before the next turn (``[198]``, the
    ``"\\n"`` of Qwen's ChatML); [] when there are none or they cannot be found.

    Two user turns that differ only in their body share everything after the body: the close token(s) and the
    separator. The separator is what follows the last eos id in that shared tail (the model emits the close token
    itself), or the tail less its first token when the tokenizer's eos ids do not occur there. A user turn is
    probed, not an assistant turn, because thinking templates (Qwen3) add ``<think></think>`` to assistant turns."""
    pair = _user_turn_pair(tokenizer, **apply_chat_template_kwargs)
    if pair is None:
        logger.warning("chat template renders no user turn; assuming no turn separator")
        return []
    empty, filled = pair
    shared = 0
    while shared < min(len(empty), len(filled)) and empty[-1 - shared] == filled[-1 - shared]:
        shared += 1
    tail = empty[len(empty) - shared :]
    if not tail:
        return []
    eos_ids = _eos_ids(tokenizer)
    close = max((i for i, token in enumerate(tail) if token in eos_ids), default=0)
    return tail[close + 1 :]
