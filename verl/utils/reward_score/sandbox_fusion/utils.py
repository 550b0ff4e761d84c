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
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import math
import time
import urllib.error
import urllib.request
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = [
    "LOCAL_SANDBOX_URLS",
    "MAX_RETRIES",
    "SUPPORTED_LANGUAGES",
    "call_sandbox_api",
    "is_local",
    "run_code",
    "run_in_local_sandbox",
    "run_sync",
]

logger = logging.getLogger(__name__)

MAX_RETRIES = 3  # attempts when the service answers 504
RETRY_DELAY_S = 1.0  # the wait before retry k is k times this
API_TIMEOUT_S = 10  # added to compile + run timeouts for the HTTP request itself
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
