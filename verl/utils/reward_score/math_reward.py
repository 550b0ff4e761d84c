"""MATH-style rule reward: the answer is the last ``\\boxed{...}`` of the response, compared after normalization.

``compute_score`` is 1.0 when the boxed answer equals the ground truth, else 0.0. Two answers are equal when their
normalized strings are (``\\dfrac{1}{2}`` = ``\\frac12`` = ``1/2``; units, ``$``, ``\\left``/``\\right``, degree signs,
percent signs, ``x =`` prefixes and spaces dropped), or when both are numbers, integers or simple fractions with the
same value (``0.5`` = ``\\frac{1}{2}``). For symbolic equivalence install ``math-verify`` (``pip install
verl[math]``): ``default_compute_score`` then uses :mod:`verl.utils.reward_score.math_verify` instead.
"""

from __future__ import annotations

import re

__all__ = ["compute_score", "is_equiv", "last_boxed_only_string", "normalize_answer", "remove_boxed"]

_BOX_COMMANDS = ("\\boxed", "\\fbox")


def last_boxed_only_string(string: str) -> str | None:
    """The last ``\\boxed{...}`` (braces balanced) or ``\\boxed x`` in ``string``, command included; None if absent."""
    start = max(string.rfind(cmd) for cmd in _BOX_COMMANDS)
    if start < 0:
        return None
    cmd = next(c for c in _BOX_COMMANDS if string.startswith(c, start))
    rest = string[start + len(cmd) :]
    if rest.startswith(" "):  # "\boxed 5": the argument runs to the next "$" or the end
        return cmd + " " + rest[1:].split("$")[0].strip()
    if not rest.startswith("{"):
        return None
    depth = 0
    for i, ch in enumerate(rest):
        depth += (ch == "{") - (ch == "}")
        if depth == 0:
            return cmd + rest[: i + 1]
    return None  # unbalanced braces: no complete answer


def remove_boxed(boxed: str) -> str:
    """``\\boxed{x}`` / ``\\boxed x`` → ``x``."""
    for cmd in _BOX_COMMANDS:
        if boxed.startswith(cmd + "{") and boxed.endswith("}"):
            return boxed[len(cmd) + 1 : -1]
        if boxed.startswith(cmd + " "):
            return boxed[len(cmd) + 1 :]
    return boxed


_SIMPLE_REPLACEMENTS = (
    ("\n", ""),
    ("\\!", ""),
    ("\\,", ""),
    ("\\;", ""),
    ("\\:", ""),
    ("\\\\", "\\"),
    ("tfrac", "frac"),
    ("dfrac", "frac"),
    ("\\left", ""),
    ("\\right", ""),
    ("^{\\circ}", ""),
    ("^\\circ", ""),
    ("\\$", ""),
    ("$", ""),
    ("\\%", ""),
    ("%", ""),
)
_TEXT_UNITS = re.compile(r"\\(?:text|mbox|mathrm)\{[^{}]*\}$")
_TEXT_WRAP = re.compile(r"\\(?:text|mbox|mathrm)\{([^{}]*)\}")
_FRAC_SHORT = re.compile(r"\\frac(?:\{([^{}]*)\}|(\w))(?:\{([^{}]*)\}|(\w))")
_SQRT_SHORT = re.compile(r"\\sqrt(\w)")
_SLASH_FRACTION = re.compile(r"^(-?\d+)/(\d+)$")


def normalize_answer(answer: str) -> str:
    """A canonical string for a MATH answer (see the module docstring for what is dropped or rewritten)."""
    s = answer.strip()
    for old, new in _SIMPLE_REPLACEMENTS:
        s = s.replace(old, new)
    s = s.strip()
    without_units = _TEXT_UNITS.sub("", s).strip()
    s = without_units or s  # a trailing \text{...} is a unit, unless it is the whole answer
    s = _TEXT_WRAP.sub(r"\1", s)
    if "=" in s and len(s.split("=")[0].strip()) <= 2:  # "x = 5" → "5"
        s = s.split("=", 1)[1]
    s = s.replace(" ", "")
    s = _FRAC_SHORT.sub(lambda m: f"\\frac{{{m.group(1) or m.group(2)}}}{{{m.group(3) or m.group(4)}}}", s)
    s = _SQRT_SHORT.sub(r"\\sqrt{\1}", s)
    s = _SLASH_FRACTION.sub(r"\\frac{\1}{\2}", s)
    if s.startswith("."):
        s = "0" + s
    s = s.replace("{.", "{0.")
    return s.rstrip(".")


_LATEX_FRACTION = re.compile(r"^(-?)\\frac\{(-?\d+)\}\{(-?\d+)\}$")


def _as_number(s: str) -> float | None:
    """The value of an integer, decimal or integer fraction (already normalized), else None."""
    try:
        return float(s.replace(",", ""))
    except ValueError:
        pass
    m = _LATEX_FRACTION.match(s)
    if m and int(m.group(3)) != 0:
        value = int(m.group(2)) / int(m.group(3))
        return -value if m.group(1) else value
    return None


def is_equiv(answer: str | None, truth: str | None) -> bool:
    """True when the two answers are the same after normalization, or have the same numeric value."""
    if answer is None or truth is None:
        return answer is None and truth is None
    a, b = normalize_answer(answer), normalize_answer(truth)
    if a == b:
        return True
    x, y = _as_number(a), _as_number(b)
    return x is not None and y is not None and abs(x - y) <= 1e-6 * max(1.0, abs(y))


def compute_score(solution_str: str, ground_truth: str) -> float:
    """1.0 when the last boxed answer of ``solution_str`` equals ``ground_truth`` (boxed or not), else 0.0."""
    boxed = last_boxed_only_string(solution_str)
    if boxed is None:
        return 0.0
    truth_boxed = last_boxed_only_string(str(ground_truth))
    truth = remove_boxed(truth_boxed) if truth_boxed is not None else str(ground_truth)
    return 1.0 if is_equiv(remove_boxed(boxed), truth) else 0.0
