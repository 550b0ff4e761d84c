"""GSM8K rule reward: the final answer follows ``####`` (the format GSM8K's reference solutions use).

``compute_score`` returns ``score`` (1.0) when the extracted answer equals the ground truth, ``format_score`` (0.0)
when an answer was found but is wrong, and 0.0 when none was found. Only the last 300 characters are searched, so a
long response cannot be rewarded for an early ``####`` it later contradicts.
"""

from __future__ import annotations

import re

__all__ = ["compute_score", "extract_solution"]

_TAIL_CHARS = 300
_STRICT = re.compile(r"#### *(-?[0-9.,]+)")
_NUMBER = re.compile(r"-?[0-9.,]+")


def _clean(number: str) -> str:
    """``"1,234."`` → ``"1234"``: thousands separators and a trailing period dropped."""
    return number.replace(",", "").rstrip(".")


def extract_solution(solution_str: str, method: str = "strict") -> str | None:
    """The answer in ``solution_str``, or None.

    ``strict``: the number after the last ``####``. ``flexible``: the last number anywhere (in the tail).
    """
    tail = solution_str[-_TAIL_CHARS:]
    if method == "strict":
        found = _STRICT.findall(tail)
    elif method == "flexible":
        found = [n for n in _NUMBER.findall(tail) if _clean(n) not in ("", "-")]
    else:
        raise ValueError(f"gsm8k.extract_solution: method must be 'strict' or 'flexible', got {method!r}")
    return _clean(found[-1]) if found else None


def compute_score(
    solution_str: str, ground_truth: str, method: str = "strict", format_score: float = 0.0, score: float = 1.0
) -> float:
    """``score`` for a right answer, ``format_score`` for a wrong one, 0.0 when no answer can be extracted."""
    answer = extract_solution(solution_str, method=method)
    if answer is None:
        return 0.0
    return score if _same_number(answer, _clean(str(ground_truth).strip())) else format_score


def _same_number(answer: str, truth: str) -> bool:
    """Equal as strings, or as numbers (``"72.00"`` is ``"72"``)."""
    if answer == truth:
        return True
    try:
        return float(answer) == float(truth)
    except ValueError:
        return False
