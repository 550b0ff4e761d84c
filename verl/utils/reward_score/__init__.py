"""Rule-based rewards, and ``default_compute_score``, which picks one by the sample's ``data_source``.

| data_source                                                                 | scorer                           |
|-----------------------------------------------------------------------------|----------------------------------|
| ``openai/gsm8k``, ``gsm8k``                                                 | :mod:`.gsm8k` (``#### <n>``)     |
| ``lighteval/MATH``, ``DigitalLearningGmbH/MATH-lighteval``,                 | :mod:`.math_verify` when         |
| ``HuggingFaceH4/MATH-500``                                                  | math-verify is installed, else   |
|                                                                             | :mod:`.math_reward` (``\\boxed``) |
| ``math_dapo``, ``math``, ``math_dapo_reasoning``, any name starting with    | :mod:`.math_dapo` (DAPO's        |
| ``aime`` (veRL's routing)                                                   | ``Answer:`` line, ±1)            |
| ``verl/arithmetic`` (the built-in demo task)                                | :mod:`.arithmetic`               |
| ``codecontests``, ``apps``, ``codeforces``, ``taco`` (code with test cases) | :mod:`.prime_code` (share of the |
|                                                                             | cases passed; local sandbox, or  |
|                                                                             | ``sandbox_fusion_url``)          |

Any other data source raises ``NotImplementedError``: score it with ``reward.custom_reward_function.path``.
"""

from __future__ import annotations

import functools
import importlib.util
from typing import Any

from verl.utils.reward_score import arithmetic, gsm8k, math_dapo, math_reward

__all__ = [
    "CODE_DATA_SOURCES",
    "DAPO_DATA_SOURCES",
    "DAPO_DATA_SOURCE_PREFIX",
    "GSM8K_DATA_SOURCES",
    "MATH_DATA_SOURCES",
    "default_compute_score",
    "is_dapo_data_source",
    "math_verify_available",
]

GSM8K_DATA_SOURCES = ("openai/gsm8k", "gsm8k")
MATH_DATA_SOURCES = ("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500")
DAPO_DATA_SOURCES = ("math_dapo", "math", "math_dapo_reasoning")
CODE_DATA_SOURCES = ("codecontests", "apps", "codeforces", "taco")
DAPO_DATA_SOURCE_PREFIX = "aime"  # AIME 2024/2025 evaluation sets, named aime24, aime_2025, ...


def is_dapo_data_source(data_source: str) -> bool:
    """Whether ``data_source`` is scored by DAPO's rule (:mod:`.math_dapo`), as veRL routes it."""
    return data_source in DAPO_DATA_SOURCES or str(data_source).startswith(DAPO_DATA_SOURCE_PREFIX)


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
    ``concurrent_semaphore`` and ``memory_limit_mb`` say where code runs for the code data sources (the local
    sandbox when the URL is empty); the other scorers do not use them.
    """
    if data_source in GSM8K_DATA_SOURCES:
        result: float | dict[str, Any] = gsm8k.compute_score(solution_str, ground_truth)
    elif data_source in MATH_DATA_SOURCES:
        if math_verify_available():
            from verl.utils.reward_score import math_verify

            result = math_verify.compute_score(solution_str, ground_truth)
        else:
            result = math_reward.compute_score(solution_str, ground_truth)
    elif is_dapo_data_source(data_source):
        result = math_dapo.compute_score(solution_str, ground_truth)
    elif data_source == arithmetic.DATA_SOURCE:
        result = arithmetic.compute_score(solution_str, ground_truth, extra_info)
    elif data_source in CODE_DATA_SOURCES:
        from verl.utils.reward_score import prime_code

        run_options = {"sandbox_fusion_url": sandbox_fusion_url, "concurrent_semaphore": concurrent_semaphore}
        if memory_limit_mb is not None:
            run_options["memory_limit_mb"] = memory_limit_mb
        success, _ = prime_code.compute_score(solution_str, ground_truth, continuous=True, **run_options)
        result = float(success)
    else:
        known = [
            *GSM8K_DATA_SOURCES, *MATH_DATA_SOURCES, *DAPO_DATA_SOURCES, "aime*", arithmetic.DATA_SOURCE,
            *CODE_DATA_SOURCES,
        ]  # fmt: skip
        raise NotImplementedError(
            f"default_compute_score has no rule for data_source={data_source!r} (known: {known}); "
            "set reward.custom_reward_function.path (and .name) to a file defining "
            "compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs)"
        )
    return result if isinstance(result, dict) else float(result)
