"""Reward of the built-in demo task (``data_source = "verl/arithmetic"``): "What is 3 + 4?" → "7".

The demo trains a randomly initialized tiny model, so the reward must give a signal long before any answer is right.
Each part can be learned one token at a time, and a random policy already earns a little of the first two::

    text      = solution_str.strip()
    lead      = the integer that text starts with, if any                    ("7", "7 apples" → 7; "x7" → none)
    starts    = 1 if there is a lead, else 0
    closeness = max(0, 1 − |lead − ground_truth| / 10), or 0 without a lead  (1 only for the right number)
    stop      = 1 if the response ended with EOS and text is just the lead; 0.5 if it ended otherwise; 0 if cut off
    score     = 0.2 · starts + 0.4 · closeness + 0.4 · stop                 ∈ [0, 1]; a right bare answer scores 1
    acc       = 1 if text is just the lead and lead == ground_truth, else 0
    pred      = the lead as a string ("" without one): the answer that validation's maj@N votes on

Multi-turn (tool) responses: the answer is the model's last turn — the text after the last ``</tool_response>``
and the ``assistant`` role header that follows it (the tool demo, :mod:`verl.utils.demo_tools`).

"Ended with EOS" is ``extra_info["response_ended"]``, which verl's reward managers set for every sample (the last
valid response token is the tokenizer's EOS, so the response was not cut at ``max_response_length``). Without that
key a response counts as ended when it is a bare integer.

Why this shape: a reward for "many digits" makes a tiny policy fill its whole response with digits and never stop
(every sample then scores the same, and GRPO's group advantages are all zero). Here only the first number counts, and
any EOS is worth something, so the policy learns to start with a digit, then to stop right after the number.
Measured with a plain GRPO loop on the demo model (16 prompts × 4 samples, 8 response tokens, lr 3e-3, 3 seeds):
the mean score goes from ~0.02 at the first step to 0.77-0.88 after 40 steps (lr 1e-3: ~0.26 after 40, ~0.8 after 80).
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["DATA_SOURCE", "compute_score"]

DATA_SOURCE = "verl/arithmetic"

_LEADING_INTEGER = re.compile(r"[-+]?\d+")
_MAX_DIGITS = 18  # a longer lead is far from any answer (and int() of thousands of digits is refused)


_AFTER_TOOLS = re.compile(r"^\s*assistant\s*\n")


def _last_turn(text: str) -> str:
    """The text after the last tool response (and its ``assistant`` header); all of ``text`` without one."""
    if "</tool_response>" not in text:
        return text
    return _AFTER_TOOLS.sub("", text.rsplit("</tool_response>", 1)[1], count=1)


def compute_score(solution_str: str, ground_truth: str | int, extra_info: dict | None = None) -> dict[str, Any]:
    """Score one response to a demo question: ``{"score", "acc", "stop", "pred"}`` (see the module docstring)."""
    text = _last_turn(solution_str).strip()
    truth = int(str(ground_truth).strip())
    match = _LEADING_INTEGER.match(text)
    lead = int(match.group()) if match and len(match.group()) <= _MAX_DIGITS else None
    bare = match is not None and match.group() == text
    closeness = max(0.0, 1.0 - abs(lead - truth) / 10) if lead is not None else 0.0
    ended = (extra_info or {}).get("response_ended")
    ended = bare if ended is None else bool(ended)
    stop = (1.0 if bare else 0.5) if ended else 0.0
    score = 0.2 * (match is not None) + 0.4 * closeness + 0.4 * stop
    acc = 1.0 if bare and lead == truth else 0.0
    return {"score": score, "acc": acc, "stop": stop, "pred": "" if lead is None else str(lead)}
