"""veRL's ``prime_code.utils.check_correctness``: :func:`~.testing_util.run_test` with veRL's return shape.

veRL wraps ``run_test`` in a ``multiprocessing`` child with a global timeout; here ``run_test`` already runs the code
in a sandboxed subprocess under a global wall limit, so this only adapts the result.
"""

from __future__ import annotations

from typing import Any

from verl.utils.reward_score.prime_code.testing_util import run_test

__all__ = ["check_correctness"]


def check_correctness(
    in_outs: dict[str, Any] | None, generation: str, timeout: float = 10, debug: bool = True, **run_options: Any
) -> tuple[list[bool | int], list[dict[str, Any]]]:
    """``(results, [metadata])`` of ``generation`` on ``in_outs`` (each case within ``timeout`` seconds);
    ``run_options`` go to :func:`~.testing_util.run_test` (``sandbox_fusion_url``, ``memory_limit_mb``,
    ``concurrent_semaphore``)."""
    results, metadata = run_test(in_outs or {}, test=generation, debug=debug, timeout=timeout, **run_options)
    return results, [metadata]
