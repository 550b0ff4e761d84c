"""MATH reward through the ``math-verify`` package (symbolic equivalence): ``pip install verl[math]``.

``default_compute_score`` uses this module for MATH data sources whenever ``math_verify`` can be imported, and
:mod:`verl.utils.reward_score.math_reward` otherwise.
"""

from __future__ import annotations

import threading

__all__ = ["compute_score"]

_MATH_VERIFY_TIMEOUT_S = 5  # math-verify's own alarm-based limit; it only works in a process's main thread


def compute_score(model_output: str, ground_truth: str, timeout_score: float = 0.0) -> float:
    """1.0 when ``math_verify`` finds the answer in ``model_output`` equivalent to ``ground_truth``, else 0.0.

    ``timeout_score`` is returned when math-verify gives up on a pathological expression.
    """
    try:
        from math_verify import LatexExtractionConfig, parse, verify
        from math_verify.errors import TimeoutException
    except ImportError as e:
        raise ImportError("verl.utils.reward_score.math_verify needs math-verify: pip install 'verl[math]'") from e
    limit = _MATH_VERIFY_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    truth = str(ground_truth)
    if "\\boxed" not in truth:
        truth = "\\boxed{" + truth + "}"
    try:
        gold = parse(truth, extraction_config=[LatexExtractionConfig()], parsing_timeout=limit)
        answer = parse(model_output, parsing_timeout=limit)
        return 1.0 if gold and answer and verify(gold, answer, timeout_seconds=limit) else 0.0
    except TimeoutException:
        return timeout_score
