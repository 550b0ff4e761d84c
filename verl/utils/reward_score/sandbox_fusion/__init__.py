"""veRL's ``verl.utils.reward_score.sandbox_fusion``: the SandboxFusion client (:func:`.utils.call_sandbox_api`) and
the local-sandbox stand-in that answers in the same shape (:func:`.utils.run_code`), and veRL's per-test-case grading
on the service (:func:`.utils.check_correctness`). Code with test cases is scored by
:mod:`verl.utils.reward_score.prime_code`."""

from verl.utils.reward_score.sandbox_fusion.utils import (
    SUPPORTED_LANGUAGES,
    call_sandbox_api,
    check_correctness,
    is_local,
    run_code,
    run_in_local_sandbox,
)

__all__ = [
    "SUPPORTED_LANGUAGES",
    "call_sandbox_api",
    "check_correctness",
    "is_local",
    "run_code",
    "run_in_local_sandbox",
]
