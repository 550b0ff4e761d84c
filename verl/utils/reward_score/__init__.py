"""Rule-based rewards, and ``default_compute_score``, which picks one by the sample's ``data_source``.

| data_source                                                                 | scorer                           |
|-----------------------------------------------------------------------------|----------------------------------|
| ``openai/gsm8k``, ``gsm8k``                                                 | :mod:`.gsm8k` (``#### <n>``)     |
| ``lighteval/MATH``, ``DigitalLearningGmbH/MATH-lighteval``,                 | :mod:`.math_verify` when         |
| ``HuggingFaceH4/MATH-500``, ``math``                                        | math-verify is installed, else   |
|                                                                             | :mod:`.math_reward` (``\\boxed``) |
| ``verl/arithmetic`` (the built-in demo task)                                | :mod:`.arithmetic`               |

Any other data source raises ``NotImplementedError``: score it with ``custom_reward_function.path``.
"""

from __future__ import annotations

import functools
import importlib.util
from typing import Any

from verl.utils.reward_score import arithmetic, gsm8k, math_reward

__all__ = ["GSM8K_DATA_SOURCES", "MATH_DATA_SOURCES", "default_compute_score", "math_verify_available"]

GSM8K_DATA_SOURCES = ("openai/gsm8k", "gsm8k")
MATH_DATA_SOURCES = ("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500", "math")


@functools.lru_cache(maxsize=1)
def math_verify_available() -> bool:
    """Whether the optional ``math-verify`` package can be imported."""
    return importlib.util.find_spec("math_verify") is not None


def default_compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict | None = None,
    sandbox_fusion_url: str | None = None,
    concurrent_semaphore: Any = None,
    memory_limit_mb: int | None = None,
    **kwargs: Any,
) -> float | dict[str, Any]:
    """Score ``solution_str`` against ``ground_truth`` with the rule for ``data_source`` (table in the module doc).

    Returns a float, or a dict with a ``"score"`` key and extra values (logged per sample). ``sandbox_fusion_url``,
    ``concurrent_semaphore`` and ``memory_limit_mb`` are accepted for veRL compatibility (code sandboxes); no
    built-in scorer uses them.
    """
    if data_source in GSM8K_DATA_SOURCES:
        result: float | dict[str, Any] = gsm8k.compute_score(solution_str, ground_truth)
    elif data_source in MATH_DATA_SOURCES:
        if math_verify_available():
            from verl.utils.reward_score import math_verify

            result = math_verify.compute_score(solution_str, ground_truth)
        else:
            result = math_reward.compute_score(solution_str, ground_truth)
    elif data_source == arithmetic.DATA_SOURCE:
        result = arithmetic.compute_score(solution_str, ground_truth, extra_info)
    else:
        known = [*GSM8K_DATA_SOURCES, *MATH_DATA_SOURCES, arithmetic.DATA_SOURCE]
        raise NotImplementedError(
            f"default_compute_score has no rule for data_source={data_source!r} (known: {known}); "
            "set custom_reward_function.path (and .name) to a file defining "
            "compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs)"
        )
    return result if isinstance(result, dict) else float(result)
