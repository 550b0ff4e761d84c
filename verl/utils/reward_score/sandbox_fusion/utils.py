"""Run code the SandboxFusion way: POST it to a SandboxFusion ``/run_code`` service, or run it in our local sandbox.

Both return SandboxFusion's response, so callers read one shape::

    {"status": "Success" | "Failed" | "SandboxError", "message": str,
     "compile_result": None | {...},
     "run_result": {"status": "Finished" | "TimeLimitExceeded" | "Error", "execution_time": float,
                    "return_code": int | None, "stdout": str, "stderr": str}}

:func:`call_sandbox_api` (veRL's name and signature) posts veRL's request body ``{"compile_timeout", "run_timeout",
"code", "stdin", "memory_limit_MB", "language", "files": {}, "fetch_files": []}`` and retries a 504 Gateway Timeout
up to :data:`MAX_RETRIES` times (waiting 1 s, then 2 s); any other failure returns ``(None, error text)`` at once.

:func:`run_in_local_sandbox` runs Python in :class:`~verl.tools.sandbox.PythonSandbox` (namespaces, rlimits, the
standard library only): ``run_timeout`` becomes the wall and CPU limits, ``memory_limit_mb`` the address-space
limit. A run cut at the time limit reports ``TimeLimitExceeded``; one killed otherwise (a signal, output over
:data:`LOCAL_OUTPUT_BYTES`) reports ``Error``. It cannot feed ``stdin`` and runs no language but Python.

:func:`run_code` picks between them: a ``sandbox_fusion_url`` that is empty, None or ``"local"`` means the local
sandbox.

:func:`check_correctness` (veRL's name and signature) runs a program on the service once per test case, the cases at
once (at most ``concurrent_semaphore``'s count in flight across the threads and processes that share it), and
grades each: ``True`` (its stdout equals the expected output, trailing newlines aside), ``False`` (another output),
``-1`` (the API call or the sandbox failed), ``-2`` (a runtime error), ``-3`` (the run timed out), ``-4`` (it did not
compile; the cases after the first such one count as not compiling too). A case's ``assert_case`` is appended to the
code. With ``fn_name`` (call-based problems, Python), the program calls that function (or ``Solution().<fn_name>``)
with the case's input parsed as JSON (a list: positional arguments) and prints the result as JSON; an output then
matches when both parse to equal JSON values.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import math
import time
import urllib.error
import urllib.request
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = [
    "DEFAULT_TIMEOUT",
    "LOCAL_SANDBOX_URLS",
    "MAX_RETRIES",
    "SUPPORTED_LANGUAGES",
    "call_sandbox_api",
    "check_correctness",
    "is_local",
    "run_code",
    "run_in_local_sandbox",
    "run_sync",
]

logger = logging.getLogger(__name__)

MAX_RETRIES = 3  # attempts when the service answers 504
RETRY_DELAY_S = 1.0  # the wait before retry k is k times this
API_TIMEOUT_S = 10  # added to compile + run timeouts for the HTTP request itself
DEFAULT_TIMEOUT = 10  # seconds a test case may compile, and run
LOCAL_SANDBOX_URLS = ("", "local")  # (and None) run in the local sandbox
LOCAL_OUTPUT_BYTES = 1 << 20  # stdout and stderr cap of a local run, each
# SandboxFusion's languages (its README); the local sandbox runs only "python".
SUPPORTED_LANGUAGES = (
    "python", "cpp", "nodejs", "go", "go_test", "java", "php", "csharp", "bash", "typescript", "sql", "rust",
    "cuda", "lua", "R", "perl", "D_ut", "ruby", "scala", "julia", "pytest", "junit", "kotlin_script", "jest",
    "verilog", "python_gpu", "lean", "swift", "racket",
)  # fmt: skip

T = TypeVar("T")


def is_local(sandbox_fusion_url: str | None) -> bool:
    """Whether ``sandbox_fusion_url`` asks for the local sandbox (None, ``""`` or ``"local"``)."""
    return sandbox_fusion_url is None or str(sandbox_fusion_url).strip() in LOCAL_SANDBOX_URLS


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion from synchronous code, whether or not this thread already runs an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def call_sandbox_api(
    sandbox_fusion_url: str,
    code: str,
    stdin: str | None,
    compile_timeout: int,
    run_timeout: int,
    memory_limit_mb: int,
    language: str = "python",
) -> tuple[dict[str, Any] | None, str | None]:
    """POST ``code`` to the SandboxFusion service; returns ``(response JSON, None)`` or ``(None, error text)``."""
    if language not in SUPPORTED_LANGUAGES:
        return None, f"Unsupported language: {language!r} (SandboxFusion runs {', '.join(SUPPORTED_LANGUAGES)})"
    body = {
        "compile_timeout": compile_timeout,
        "run_timeout": run_timeout,
        "code": code,
        "stdin": stdin,
        "memory_limit_MB": memory_limit_mb,
        "language": language,
        "files": {},
        "fetch_files": [],
    }
    data = json.dumps(body).encode()
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    request_timeout = compile_timeout + run_timeout + API_TIMEOUT_S
    error = "no attempt made"
    for attempt in range(1, MAX_RETRIES + 1):
        request = urllib.request.Request(sandbox_fusion_url, data=data, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=request_timeout) as reply:
                text = reply.read().decode("utf-8", errors="replace")
        except urllib.error.HTTPError as exc:
            error = f"API Call Failed: HTTP {exc.code} {exc.reason} from {sandbox_fusion_url}"
            if exc.code == 504 and attempt < MAX_RETRIES:
                logger.warning("%s (attempt %d of %d); retrying", error, attempt, MAX_RETRIES)
                time.sleep(RETRY_DELAY_S * attempt)
                continue
            break
        except (urllib.error.URLError, OSError) as exc:
            error = f"API Call Failed: {sandbox_fusion_url}: {exc}"
            break
        try:
            return json.loads(text), None
        except ValueError as exc:
            error = f"API Call Failed: the response of {sandbox_fusion_url} is not JSON ({exc}): {text[:200]!r}"
            break
    logger.error("sandbox API call failed: %s", error)
    return None, error


async def run_in_local_sandbox_async(code: str, run_timeout: float, memory_limit_mb: int) -> dict[str, Any]:
    """:func:`run_in_local_sandbox` for callers inside an event loop."""
    from verl.tools.sandbox import PythonSandbox, SandboxLimits

    limits = SandboxLimits(
        cpu_seconds=max(1, math.ceil(run_timeout)),
        wall_seconds=run_timeout,
        memory_mb=int(memory_limit_mb),
        output_bytes=LOCAL_OUTPUT_BYTES,
    )
    sandbox = PythonSandbox(limits)
    await asyncio.to_thread(sandbox.check)  # once per process; raises SandboxUnavailableError without isolation
    start = time.monotonic()
    result = await sandbox.run(code)
    elapsed = time.monotonic() - start
    if result.exit_code is not None and not result.timed_out:
        run_status = "Finished"
    elif "time limit" in (result.error or ""):
        run_status = "TimeLimitExceeded"
    else:
        run_status = "Error"
    run_result = {
        "status": run_status,
        "execution_time": elapsed,
        "return_code": result.exit_code,
        "stdout": result.stdout,
        "stderr": result.stderr,
    }
    ok = run_status == "Finished" and result.exit_code == 0
    message = "" if ok else (result.error or "")
    status = "Success" if ok else "Failed"
    return {"status": status, "message": message, "compile_result": None, "run_result": run_result}


def run_in_local_sandbox(code: str, run_timeout: float, memory_limit_mb: int) -> dict[str, Any]:
    """Run Python ``code`` in the local sandbox; returns a SandboxFusion response (see the module docstring)."""
    return run_sync(run_in_local_sandbox_async(code, run_timeout, memory_limit_mb))


def run_code(
    sandbox_fusion_url: str | None, code: str, timeout: float, memory_limit_mb: int, language: str = "python"
) -> tuple[dict[str, Any] | None, str | None]:
    """Run ``code`` locally or on the service (see :func:`is_local`); returns ``(response, None)`` or
    ``(None, error text)``. Raises :class:`~verl.tools.sandbox.SandboxUnavailableError` when local isolation
    cannot be set up."""
    if not is_local(sandbox_fusion_url):
        return call_sandbox_api(str(sandbox_fusion_url), code, None, timeout, timeout, memory_limit_mb, language)
    if language != "python":
        return None, f"language {language!r} cannot run in the local sandbox (python only); set sandbox_fusion_url"
    return run_in_local_sandbox(code, timeout, memory_limit_mb), None


# check_correctness's grade of a case that did not pass (veRL's codes)
API_ERROR, RUNTIME_ERROR, RUN_TIMEOUT, COMPILE_ERROR = -1, -2, -3, -4

_CALL_WRAPPER = """

import json as _verl_json
import sys as _verl_sys

_verl_args = _verl_json.loads(_verl_sys.stdin.read() or "[]")
_verl_fn = globals().get({name!r}) or getattr(globals()["Solution"](), {name!r})
_verl_out = _verl_fn(*_verl_args) if isinstance(_verl_args, list) else _verl_fn(_verl_args)
print(_verl_json.dumps(_verl_out))
"""


def _same_output(actual: str, expected: Any, as_json: bool) -> bool:
    if str(actual).rstrip("\n") == str(expected).rstrip("\n"):
        return True
    if not as_json:
        return False
    try:
        want = json.loads(expected) if isinstance(expected, str) else expected
        return json.loads(actual) == want
    except (TypeError, ValueError):
        return False


def _grade(response: dict[str, Any], expected: Any, as_json: bool, meta: dict[str, Any]) -> bool | int:
    """The grade of one case from SandboxFusion's ``response``; ``meta`` gets its details."""
    compiled, run = response.get("compile_result") or {}, response.get("run_result") or {}
    meta.update(
        api_status=response.get("status"),
        compile_status=compiled.get("status"),
        compile_duration=compiled.get("execution_time"),
        compile_stderr=compiled.get("stderr"),
        run_status=run.get("status"),
        stdout=run.get("stdout"),
        stderr=run.get("stderr"),
        exit_code=run.get("return_code"),
        duration=run.get("execution_time"),
    )
    status = response.get("status")
    if status == "Success" and run.get("status") == "Finished":
        passed = expected is None or _same_output(run.get("stdout") or "", expected, as_json)
        meta["status"] = "success" if passed else "wrong_answer"
        return passed
    if status == "Failed":
        compile_failed = compiled and (
            compiled.get("status") in ("Error", "TimeLimitExceeded")
            or (compiled.get("status") == "Finished" and compiled.get("return_code") != 0)
        )
        if compile_failed:
            meta["status"] = "compile_timeout" if compiled.get("status") == "TimeLimitExceeded" else "compile_error"
            return COMPILE_ERROR
        if run.get("status") == "TimeLimitExceeded":
            meta["status"] = "timeout"
            return RUN_TIMEOUT
        if run.get("status") == "Error" or (run.get("status") == "Finished" and run.get("return_code") != 0):
            meta["status"] = "runtime_error"
            return RUNTIME_ERROR
    meta["status"] = "sandbox_error" if status == "SandboxError" else f"unexpected_state_{status}"
    return API_ERROR


def _check_case(
    index: int,
    stdin: Any,
    expected: Any,
    sandbox_fusion_url: str,
    code: str,
    timeout: int,
    memory_limit_mb: int,
    language: str,
    semaphore: Any,
    as_json: bool,
) -> tuple[bool | int, dict[str, Any]]:
    meta: dict[str, Any] = {
        "case_index": index,
        "input": stdin if stdin is None else str(stdin),
        "expected_output": expected if expected is None else str(expected),
        "api_request_error": None,
        "api_response": None,
        "status": "unknown",
    }
    stdin_text = stdin if stdin is None or isinstance(stdin, str) else json.dumps(stdin)
    with semaphore if semaphore is not None else contextlib.nullcontext():
        response, error = call_sandbox_api(
            sandbox_fusion_url=sandbox_fusion_url,
            code=code,
            stdin=stdin_text,
            compile_timeout=timeout,
            run_timeout=timeout,
            memory_limit_mb=memory_limit_mb,
            language=language,
        )
    if error is not None or response is None:
        meta.update(status="api_error", api_request_error=error or "no response")
        return API_ERROR, meta
    meta["api_response"] = response
    return _grade(response, expected, as_json, meta), meta


def check_correctness(
    sandbox_fusion_url: str,
    in_outs: dict[str, Any] | None,
    generation: str,
    timeout: int = DEFAULT_TIMEOUT,
    memory_limit_mb: int = 1024,
    language: str = "python",
    concurrent_semaphore: Any = None,
) -> tuple[list[bool | int], list[dict[str, Any]]]:
    """Grade ``generation`` on each test case of ``in_outs`` (``inputs``, ``outputs``, optional ``assert_case`` and
    ``fn_name``) on the SandboxFusion service; returns the grades and each case's details, in the cases' order (see
    the module docstring). Bad ``in_outs`` gives ``[-1]`` (or -1 per case when the lists' lengths differ)."""
    if not isinstance(in_outs, dict) or "inputs" not in in_outs or "outputs" not in in_outs:
        return [API_ERROR], [{"error": "Invalid input/output data"}]
    inputs, outputs = list(in_outs["inputs"]), list(in_outs["outputs"])
    if not inputs:
        return [], []
    asserts = list(in_outs.get("assert_case") or [""] * len(inputs))
    if len(outputs) != len(inputs) or len(asserts) != len(inputs):
        return [API_ERROR] * len(inputs), [
            {"error": "Input/output count mismatch", "case_index": i} for i in range(len(inputs))
        ]
    fn_name = in_outs.get("fn_name")
    as_json = bool(fn_name) and language == "python"
    base = generation + _CALL_WRAPPER.format(name=fn_name) if as_json else generation
    workers = min(len(inputs), 32)
    with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="sandbox-case") as pool:
        futures = [
            pool.submit(
                _check_case,
                i,
                stdin,
                outputs[i],
                sandbox_fusion_url,
                base + ("\n\n" + asserts[i] if asserts[i] else ""),
                timeout,
                memory_limit_mb,
                language,
                concurrent_semaphore,
                as_json,
            )
            for i, stdin in enumerate(inputs)
        ]
        graded = [future.result() for future in futures]
    results, metadata = [grade for grade, _ in graded], [meta for _, meta in graded]
    first = next((i for i, grade in enumerate(results) if grade == COMPILE_ERROR), None)
    if first is not None:  # the program does not compile: no later case counts
        for i in range(first + 1, len(results)):
            results[i] = COMPILE_ERROR
            metadata[i]["status"] = "compile_error"
    return results, metadata
