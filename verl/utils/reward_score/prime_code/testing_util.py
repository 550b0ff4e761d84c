"""veRL's ``prime_code.testing_util.run_test``: check generated code against APPS-style test cases.

Unlike veRL's, which executes the code in the calling process (after disabling ``os.kill``, ``os.remove``, ... in
it), this one runs :mod:`.harness` as one program in the local sandbox (:class:`~verl.tools.sandbox.PythonSandbox`:
its own namespaces, rlimits, the standard library only) or, given ``sandbox_fusion_url``, on that SandboxFusion
service; the caller's process is never touched and needs no wrapper process of its own. The result codes and
metadata are veRL's; see :mod:`.harness` for the comparison rules.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import secrets
from functools import cache
from pathlib import Path
from typing import Any

from verl.utils.reward_score.sandbox_fusion.utils import run_code

__all__ = ["GLOBAL_TIMEOUT_SLACK_S", "MEMORY_LIMIT_MB", "run_test"]

logger = logging.getLogger(__name__)

GLOBAL_TIMEOUT_SLACK_S = 2.0  # wall time granted beyond timeout × (cases + 1), for the sandbox to start and stop
MEMORY_LIMIT_MB = 1024  # address-space limit of the checking program


@cache
def _harness_source() -> str:
    return (Path(__file__).parent / "harness.py").read_text()


def run_test(
    in_outs: dict[str, Any],
    test: str | None = None,
    debug: bool = False,
    timeout: float = 15,
    *,
    sandbox_fusion_url: str | None = None,
    memory_limit_mb: int | None = None,
    concurrent_semaphore: Any = None,
) -> tuple[list[bool | int], dict[str, Any]]:
    """Run ``test`` (the solution's code) on the cases of ``in_outs`` (``inputs``, ``outputs``, optional
    ``fn_name``), each within ``timeout`` seconds; stops at the first failing case.

    Returns ``(results, metadata)``: one result per case checked — ``True``, ``False`` (wrong answer), ``-1``
    (runtime error or time limit) or ``-2`` (compile error) — and ``{}`` when all pass, else what went wrong
    (``error`` and ``traceback``, or ``output``/``expected``/``inputs`` with ``error_message="Wrong Answer"``).
    A checking program that dies or runs past ``timeout × (cases + 1)`` (plus a little slack) gives ``-1`` for
    every case, as veRL's global timeout does; so does a SandboxFusion service that cannot be reached.
    ``memory_limit_mb`` (default :data:`MEMORY_LIMIT_MB`) bounds the program; ``concurrent_semaphore`` (a context
    manager such as ``threading.Semaphore``) is held while it runs. Raises
    :class:`~verl.tools.sandbox.SandboxUnavailableError` when the local sandbox cannot be set up.
    """
    if test is None:
        raise ValueError("run_test needs the code to test (test=None)")
    if not in_outs or "inputs" not in in_outs or "outputs" not in in_outs:
        raise ValueError(f"run_test needs in_outs with 'inputs' and 'outputs', got {type(in_outs).__name__}")
    if len(in_outs["inputs"]) != len(in_outs["outputs"]):
        raise ValueError(
            f"run_test: {len(in_outs['inputs'])} inputs but {len(in_outs['outputs'])} outputs; they must pair up"
        )
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"run_test: timeout must be a positive number of seconds, got {timeout!r}")
    cases = len(in_outs["inputs"])
    marker = f"@@verl-run-test-{secrets.token_hex(8)}@@"
    payload = {"in_outs": copy.deepcopy(dict(in_outs)), "test": test, "timeout": timeout, "marker": marker}
    program = f"{_harness_source()}\nmain({json.dumps(json.dumps(payload))})\n"
    wall = timeout * (cases + 1) + GLOBAL_TIMEOUT_SLACK_S
    memory = memory_limit_mb or MEMORY_LIMIT_MB
    with concurrent_semaphore if concurrent_semaphore is not None else contextlib.nullcontext():
        response, error = run_code(sandbox_fusion_url, program, wall, memory)
    if response is None or not response.get("run_result"):
        reason = error or f"the service answered {str(response)[:200]}"
        logger.warning("run_test: the checking program did not run (%s); every case counts as failed", reason)
        return [-1] * cases, {"error": f"the checking program did not run ({reason})"}
    run = response["run_result"]
    found = [line[len(marker) :] for line in (run.get("stdout") or "").splitlines() if line.startswith(marker)]
    if not found:
        reason = response.get("message") or f"run status {run.get('status')}, exit code {run.get('return_code')}"
        if debug:
            stderr = (run.get("stderr") or "")[-2000:]
            logger.info("run_test: the checking program gave no result (%s): %s", reason, stderr)
        return [-1] * cases, {"error": f"the checking program gave no result ({reason})"}
    result = json.loads(found[-1])
    if debug:
        logger.info("run_test: results %s, metadata %s", result["results"], result["metadata"])
    return result["results"], result["metadata"]
