"""DAPO's rule-based math reward (Q. Yu et al., "DAPO: An Open-Source LLM Reinforcement Learning System at Scale",
2025, arXiv:2503.14476): the response must end with a line ``Answer: <answer>``, and the reward is +1 when that
answer equals the ground truth after normalisation, -1 otherwise (no partial credit, no format bonus).

``default_compute_score`` routes ``math_dapo``, ``math``, ``math_dapo_reasoning`` and every data source starting
with ``aime`` here, as veRL does. DAPO-Math-17k's prompts end with the matching instruction (:data:`ANSWER_FORMAT`).

How a response is scored (:func:`compute_score`)::

    text  = the last 300 characters of the response
    pred  = normalize_final_answer(what follows the last "Answer:" (any case) up to the end of its line),
            or "[INVALID]" when there is no such line
    acc   = pred == normalize_final_answer(ground_truth)
    score = 1.0 if acc else -1.0

:func:`normalize_final_answer` is the Minerva normalisation of final answers (Lewkowycz et al., 2022): keep what
follows the last ``=``, drop spaces, articles, ``\\$``, units and words such as "dollars" or "degrees", unwrap
``\\text{}``, ``\\textbf{}``, ``\\overline{}``, ``\\boxed{}`` and the first ``$...$`` span, write ``\\frac12`` as
``\\frac{1}{2}`` and ``\\sqrt2`` as ``\\sqrt{2}``, and remove the thousands separators of a plain integer. So
``"Answer: $1,000$ dollars"`` and ground truth ``"1000"`` agree, while ``"0.5"`` and ``"\\frac{1}{2}"`` do not (the
comparison is textual, not symbolic).

With ``strict_box_verify`` the answer is instead the last ``\\boxed{...}`` within the final 100 characters (or the
100 characters before ``pause_tokens_index[-1]``), compared with the ground truth as given, without normalisation.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = [
    "ANSWER_FORMAT",
    "ANSWER_PATTERN",
    "INVALID",
    "REMOVED_EXPRESSIONS",
    "SUBSTITUTIONS",
    "compute_score",
    "is_correct_minerva",
    "is_correct_strict_box",
    "last_boxed_only_string",
    "normalize_final_answer",
    "remove_boxed",
    "verify",
]

# The instruction DAPO-Math-17k's prompts carry (the problem goes between the two sentences).
ANSWER_FORMAT = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.",
    'Remember to put your answer on its own line after "Answer:".',
)

INVALID = "[INVALID]"  # the prediction of a response without an answer line (or without a box, when strict)

TAIL_CHARS = 300  # only the end of a response is read (MATH-500's longest answer has 159 characters)
STRICT_TAIL_CHARS = 100

ANSWER_PATTERN = r"(?i)Answer\s*:\s*([^\n]+)"  # what follows the last "Answer:", to the end of its line
_BOX_OPEN = "\\boxed{"

# Minerva's normalisation tables, applied in this order (the order matters: "an " goes before "a ", a removed
# "\text{}^2" before "\text{}").
SUBSTITUTIONS: tuple[tuple[str, str], ...] = (
    ("an ", ""),
    ("a ", ""),
    (".$", "$"),
    ("\\$", ""),
    ("\\ ", ""),
    (" ", ""),
    ("mbox", "text"),
    (",\\text{and}", ","),
    ("\\text{and}", ","),
    ("\\text{m}", "\\text{}"),
)
_UNITS_AND_WORDS = (
    "square ways integers dollars mph inches hours km units \\ldots sue points feet minutes digits cents degrees cm gm "
    "pounds meters meals edges students childrentickets multiples"
).split()
_LATEX_LEFTOVERS = (
    "\\text{s}",
    "\\text{.}",
    "\\text{\ns}",
    "\\text{}^2",
    "\\text{}^3",
    "\\text{\n}",
    "\\text{}",
    "\\mathrm{th}",
    "^\\circ",
    "^{\\circ}",
    "\\;",
    ",\\!",
    "{,}",
    '"',
    "\\dots",
)
REMOVED_EXPRESSIONS: tuple[str, ...] = (*_UNITS_AND_WORDS, *_LATEX_LEFTOVERS)

# Regex rewrites after the plain-text ones, in order: the first $...$ span, the wrappers whose content is the
# answer (\text, \textbf, \overline: up to the first "}"; \boxed: up to the last), then TeX shorthand.
_REWRITES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r".*?\$(.*?)\$.*"), r"$\1$"),
    (re.compile(r"\\text\{(.*?)\}"), r"\1"),
    (re.compile(r"\\textbf\{(.*?)\}"), r"\1"),
    (re.compile(r"\\overline\{(.*?)\}"), r"\1"),
    (re.compile(r"\\boxed\{(.*)\}"), r"\1"),
    (re.compile(r"frac([^{])(.)"), r"frac{\1}{\2}"),
    (re.compile(r"sqrt([^{])"), r"sqrt{\1}"),
)


def last_boxed_only_string(string: str) -> str | None:
    """The last ``\\boxed{...}`` of ``string`` with its braces balanced, or None (no box, or one never closed)."""
    start = string.rfind(_BOX_OPEN)
    if start < 0:
        return None
    depth = 0
    for end in range(start + len(_BOX_OPEN) - 1, len(string)):
        if string[end] == "{":
            depth += 1
        elif string[end] == "}":
            depth -= 1
            if depth == 0:
                return string[start : end + 1]
    return None


def remove_boxed(s: str) -> str:
    """The content of ``\\boxed{content}``; anything else is a ``ValueError``."""
    if not (s.startswith(_BOX_OPEN) and s.endswith("}")):
        raise ValueError(f"not a \\boxed{{...}} expression: {s!r}")
    return s[len(_BOX_OPEN) : -1]


def normalize_final_answer(final_answer: str) -> str:
    """Minerva's normal form of a final answer (the steps are listed in the module docstring)."""
    text = final_answer.split("=")[-1]
    for old, new in SUBSTITUTIONS:
        text = text.replace(old, new)
    for token in REMOVED_EXPRESSIONS:
        text = text.replace(token, "")
    for pattern, replacement in _REWRITES:
        text = pattern.sub(replacement, text)
    text = text.replace("$", "")
    without_separators = text.replace(",", "")
    if without_separators.isdigit():
        text = without_separators
    return text.strip()


def is_correct_minerva(
    solution_str: str,
    gt: str,
    gt_need_extract: bool = False,
    answer_pattern: str = ANSWER_PATTERN,
) -> tuple[bool, str]:
    """``(correct, normalised prediction)`` of the last ``answer_pattern`` match of ``solution_str`` against ``gt``
    (itself normalised; with ``gt_need_extract``, the content of its last ``\\boxed{}`` first)."""
    answers = re.findall(answer_pattern, solution_str)
    pred = normalize_final_answer(answers[-1] if answers else INVALID)
    if gt_need_extract:
        boxed = last_boxed_only_string(gt)
        if boxed is None:
            raise ValueError(f"gt_need_extract=True but the ground truth has no \\boxed{{...}}: {gt!r}")
        gt = remove_boxed(boxed)
    return pred == normalize_final_answer(gt), pred


def is_correct_strict_box(pred: str, gt: str, pause_tokens_index: list[int] | None = None) -> tuple[bool, str]:
    """``(correct, boxed content)``: the last ``\\boxed{}`` of the final 100 characters of ``pred`` (or of the 100
    before ``pause_tokens_index[-1]``, a list of 4 positions) equals ``gt`` exactly."""
    if pause_tokens_index is not None:
        if len(pause_tokens_index) != 4:
            raise ValueError(f"pause_tokens_index must hold 4 positions, got {pause_tokens_index!r}")
        tail = pred[max(0, pause_tokens_index[-1] - STRICT_TAIL_CHARS) :]
    else:
        tail = pred[-STRICT_TAIL_CHARS:]
    boxed = last_boxed_only_string(tail)
    extracted = remove_boxed(boxed) if boxed is not None else INVALID
    return extracted == gt, extracted


def verify(
    solution_str: str, answer: str, strict_box_verify: bool = False, pause_tokens_index: list[int] | None = None
) -> tuple[bool, str]:
    """``(correct, prediction)`` by the strict-box rule or the ``Answer:`` rule."""
    if strict_box_verify:
        return is_correct_strict_box(solution_str, answer, pause_tokens_index)
    return is_correct_minerva(solution_str, answer)


def compute_score(
    solution_str: str,
    ground_truth: Any,
    strict_box_verify: bool = False,
    pause_tokens_index: list[int] | None = None,
) -> dict[str, Any]:
    """DAPO's reward of one response: ``{"score": 1.0 or -1.0, "acc": bool, "pred": str}`` (see the module doc).

    Only the last 300 characters of ``solution_str`` are read. ``ground_truth`` is compared as a string.
    """
    correct, pred = verify(solution_str[-TAIL_CHARS:], str(ground_truth), strict_box_verify, pause_tokens_index)
    return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": pred}
