"""Score generated code against test cases (PRIME's code reward, veRL's ``verl.utils.reward_score.prime_code``).

``default_compute_score`` routes ``codecontests``, ``apps``, ``codeforces`` and ``taco`` here. The code runs in the
local sandbox (:mod:`.testing_util`; solutions get the Python standard library only) or, given
``sandbox_fusion_url``, on that SandboxFusion service.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from verl.utils.reward_score.prime_code.utils import check_correctness

__all__ = ["MAX_CONTINUOUS_CASES", "apps_check_correctness", "compute_score", "extract_solution"]

apps_check_correctness = check_correctness  # veRL's name for it in this module

logger = logging.getLogger(__name__)

MAX_CONTINUOUS_CASES = 10  # continuous scoring checks at most this many cases one by one (as veRL)
ALL_CASES_TIMEOUT_S = 5  # per case, when all cases run together
ONE_CASE_TIMEOUT_S = 10  # per case, when cases run one by one


def extract_solution(completion: str) -> str:
    """The code of the last fenced Python block of ``completion`` (all of it when it has no fence)."""
    return completion.split("```python")[-1].split("```")[0]


def compute_score(
    completion: str, test_cases: str | dict[str, Any], continuous: bool = False, **run_options: Any
) -> tuple[bool | float, Any]:
    """``(success, metadata)``: all test cases first; if one fails and ``continuous``, the fraction of the first
    :data:`MAX_CONTINUOUS_CASES` cases that pass, each checked on its own (with their metadata), else ``False``.

    ``test_cases`` is ``{"inputs": [...], "outputs": [...], "fn_name"?: str}`` or its JSON text; test cases that
    are not that (bad JSON, unpaired lists) score ``False`` with the problem logged, as veRL scores them.
    ``run_options`` (``sandbox_fusion_url``, ``memory_limit_mb``, ``concurrent_semaphore``) say where the code runs
    (:func:`~.testing_util.run_test`).
    """
    solution = extract_solution(completion)
    try:
        cases = test_cases if isinstance(test_cases, dict) else json.loads(test_cases)
        inputs, outputs = cases["inputs"], cases["outputs"]
        results, metadata = check_correctness(cases, solution, timeout=ALL_CASES_TIMEOUT_S, debug=False, **run_options)
    except (ValueError, KeyError, TypeError) as exc:
        logger.warning("prime_code: unusable test cases (%s: %s); the sample scores False", type(exc).__name__, exc)
        return False, None
    if all(result is True for result in results) and len(results) == len(inputs):
        return True, metadata[0]
    if not continuous:
        return False, metadata[0]
    passed, checked, metadata_list = 0, 0, []
    for case_input, case_output in list(zip(inputs, outputs))[:MAX_CONTINUOUS_CASES]:
        case = {"inputs": [case_input], "outputs": [case_output]}
        if cases.get("fn_name") is not None:
            case["fn_name"] = cases["fn_name"]
        case_results, case_metadata = check_correctness(
            case, solution, timeout=ONE_CASE_TIMEOUT_S, debug=False, **run_options
        )
        info = dict(case_metadata[0])
        info["test_case"] = {"input": str(case_input), "output": str(case_output), "res": str(case_results)}
        metadata_list.append(info)
        passed += sum(result is True for result in case_results)
        checked += len(case_results)
    return passed / max(checked, 1), metadata_list
