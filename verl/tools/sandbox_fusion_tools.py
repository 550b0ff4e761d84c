"""veRL's ``SandboxFusionTool``: runs the model's ``code`` and answers with its stdout and stderr.

Where the code runs (tool YAML ``config.sandbox_fusion_url``):

- a URL (``http://host:8080/run_code``): POSTed to that SandboxFusion service in veRL's request format
  (:func:`~verl.utils.reward_score.sandbox_fusion.utils.call_sandbox_api`);
- empty, absent or ``"local"``: our local sandbox (:class:`~verl.tools.sandbox.PythonSandbox`: namespaces and
  rlimits, the standard library only, Python only). veRL refuses an empty URL; here it means "run it here". A
  machine where isolation cannot be set up fails when the tool is built
  (:class:`~verl.tools.sandbox.SandboxUnavailableError`), never by running code unisolated.

Config keys, veRL's names and defaults, each honoured (any other key is refused by name):

- ``num_workers`` (10): threads of this tool's execution pool (calls running at once for this tool instance);
- ``rate_limit`` (10) and ``enable_global_rate_limit`` (True): at most ``rate_limit`` executions at once. With the
  global limit on, the limit is shared by every SandboxFusionTool of the Ray cluster (a named Ray actor, as in
  veRL) when Ray is initialized, else by every one of this process; the first tool's ``rate_limit`` sets it (a
  later tool asking another value gets a warning). With it off, it bounds this tool instance only (veRL then has
  no limit path that works);
- ``default_timeout`` (30 s) and ``default_language`` ("python"): used when the call's parameters give no
  ``timeout`` / ``language``; the local sandbox runs ``python`` only and refuses another default when built;
- ``memory_limit_mb`` (1024): sent as ``memory_limit_MB``; locally, the address-space limit.

As in veRL, the model sees ``stdout + stderr`` when the run finished (whatever its exit code) and
``"no stdout here"`` when it did not (time limit, killed, service unreachable); the reason is logged.
``self.execution_pool.execute.remote(fn, *args)`` returns an awaitable, so subclasses written for veRL's Ray
execution pool (``recipe/retool``) run unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar
from uuid import uuid4

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse
from verl.utils.reward_score.sandbox_fusion.utils import is_local, run_code
from verl.utils.rollout_trace import rollout_trace_op

__all__ = ["ExecutionPool", "RateLimiter", "SandboxFusionTool", "init_execution_pool"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

NO_OUTPUT = "no stdout here"  # veRL's reply for a run that did not finish
RATE_LIMITER_ACTOR = "verl-sandbox-fusion-rate-limiter"
_DEFAULTS: dict[str, Any] = {
    "sandbox_fusion_url": "",
    "num_workers": 10,
    "rate_limit": 10,
    "default_timeout": 30,
    "default_language": "python",
    "memory_limit_mb": 1024,
    "enable_global_rate_limit": True,
}
_KEYS = frozenset(_DEFAULTS) | {"type"}
_DEFAULT_SCHEMA = {
    "type": "function",
    "function": {
        "name": "code_interpreter",
        "description": "A tool for executing code.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "The code to execute."}},
            "required": ["code"],
        },
    },
}

_SHARED_LIMIT_WARNING = (
    "SandboxFusionTool: rate_limit=%d with enable_global_rate_limit, but %s global limit is already %d; that limit "
    "applies (give every tool the same rate_limit)"
)
_process_limiter: tuple[int, threading.BoundedSemaphore] | None = None
_process_limiter_lock = threading.Lock()


class RateLimiter:
    """At most ``limit`` holders at once: in this tool (``scope="tool"``), in this process (``"process"``) or in the
    Ray cluster (``"cluster"``, a named actor shared by every process of the job)."""

    def __init__(self, limit: int, scope: str) -> None:
        self.limit, self.scope = limit, scope
        self._actor: Any = None
        if scope == "tool":
            self._semaphore: threading.BoundedSemaphore | None = threading.BoundedSemaphore(limit)
        elif scope == "process":
            self._semaphore = _shared_process_semaphore(limit)
        elif scope == "cluster":
            self._semaphore = None
            self._actor = _cluster_semaphore(limit)
        else:
            raise ValueError(f"RateLimiter scope must be 'tool', 'process' or 'cluster', got {scope!r}")

    @contextlib.contextmanager
    def slot(self) -> Iterator[None]:
        """Hold one of the ``limit`` slots for the duration of the block (blocks the calling thread until free)."""
        if self._actor is not None:
            import ray

            ray.get(self._actor.acquire.remote())
            try:
                yield
            finally:
                ray.get(self._actor.release.remote())
            return
        assert self._semaphore is not None
        with self._semaphore:
            yield


def _shared_process_semaphore(limit: int) -> threading.BoundedSemaphore:
    """The process-wide semaphore. The first tool sets its limit; a tool asking another one shares it anyway (as
    veRL's named limiter does), with a warning."""
    global _process_limiter
    with _process_limiter_lock:
        if _process_limiter is None:
            _process_limiter = (limit, threading.BoundedSemaphore(limit))
        elif _process_limiter[0] != limit:
            logger.warning(_SHARED_LIMIT_WARNING, limit, "this process's", _process_limiter[0])
        return _process_limiter[1]


def _cluster_semaphore(limit: int) -> Any:
    """The job's named semaphore actor (created by the first tool); its limit must match ``limit``."""
    import ray

    @ray.remote(num_cpus=0)
    class _Semaphore:
        def __init__(self, limit: int) -> None:
            self.limit = limit
            self._semaphore = asyncio.Semaphore(limit)

        async def acquire(self) -> None:
            await self._semaphore.acquire()

        async def release(self) -> None:
            self._semaphore.release()

        async def get_limit(self) -> int:
            return self.limit

    actor = _Semaphore.options(name=RATE_LIMITER_ACTOR, get_if_exists=True, max_concurrency=100_000).remote(limit)
    existing = ray.get(actor.get_limit.remote())
    if existing != limit:
        logger.warning(_SHARED_LIMIT_WARNING, limit, f"the cluster's ({RATE_LIMITER_ACTOR})", existing)
    return actor


class _Method:
    """A bound call with Ray's ``.remote(...)`` spelling, returning an awaitable."""

    def __init__(self, fn: Callable[..., asyncio.Future]) -> None:
        self._fn = fn

    def remote(self, *args: Any, **kwargs: Any) -> asyncio.Future:
        return self._fn(*args, **kwargs)


class ExecutionPool:
    """``num_workers`` threads; each call holds a :class:`RateLimiter` slot while it runs.

    ``pool.execute.remote(fn, *args, **kwargs)`` (inside an event loop) returns an awaitable of ``fn``'s result, as
    veRL's Ray ``ExecutionWorker`` does; exceptions propagate to the awaiting caller.
    """

    def __init__(self, num_workers: int, limiter: RateLimiter) -> None:
        self.num_workers = num_workers
        self.limiter = limiter
        self._executor = ThreadPoolExecutor(num_workers, thread_name_prefix="verl-sandbox-fusion")
        self.execute = _Method(self._submit)

    def ping(self) -> bool:
        """veRL's liveness check."""
        return True

    def _submit(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> asyncio.Future:
        return asyncio.wrap_future(self._executor.submit(self._run, fn, args, kwargs))

    def _run(self, fn: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any]) -> T:
        with self.limiter.slot():
            return fn(*args, **kwargs)


def init_execution_pool(num_workers: int, enable_global_rate_limit: bool = True, rate_limit: int = 10) -> ExecutionPool:
    """An :class:`ExecutionPool` whose limiter is cluster-wide (Ray initialized), process-wide, or per pool."""
    if enable_global_rate_limit:
        import ray

        scope = "cluster" if ray.is_initialized() else "process"
    else:
        scope = "tool"
    return ExecutionPool(num_workers, RateLimiter(rate_limit, scope))


def _positive(name: str, value: Any, integral: bool) -> Any:
    kinds = int if integral else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or value <= 0:
        kind = "integer" if integral else "number"
        raise ValueError(f"SandboxFusionTool: {name} must be a positive {kind}, got {value!r}")
    return value


class SandboxFusionTool(BaseTool):
    """Runs code in a SandboxFusion service or the local sandbox; see the module docstring for the config."""

    def __init__(self, config: dict[str, Any], tool_schema: OpenAIFunctionToolSchema | None = None) -> None:
        super().__init__(config, tool_schema)
        unknown = sorted(set(self.config) - _KEYS)
        if unknown:
            raise ValueError(
                f"SandboxFusionTool: unknown config key {unknown[0]!r} (allowed: {', '.join(sorted(_KEYS))})"
            )
        settings = {**_DEFAULTS, **{k: v for k, v in self.config.items() if k != "type"}}
        self.num_workers = _positive("num_workers", settings["num_workers"], integral=True)
        self.rate_limit = _positive("rate_limit", settings["rate_limit"], integral=True)
        self.default_timeout = _positive("default_timeout", settings["default_timeout"], integral=False)
        self.memory_limit_mb = _positive("memory_limit_mb", settings["memory_limit_mb"], integral=True)
        self.default_language = str(settings["default_language"])
        self.enable_global_rate_limit = bool(settings["enable_global_rate_limit"])
        url = settings["sandbox_fusion_url"]
        self.sandbox_fusion_url = "" if url is None else str(url)
        if is_local(self.sandbox_fusion_url):
            if self.default_language != "python":
                raise ValueError(
                    f"SandboxFusionTool: default_language={self.default_language!r} cannot run in the local sandbox "
                    "(python only); set sandbox_fusion_url to a SandboxFusion service"
                )
            from verl.tools.sandbox import PythonSandbox, SandboxLimits

            PythonSandbox(SandboxLimits()).check()  # no isolation: fail now, not on the first call
        self._instance_dict: dict[str, dict[str, Any]] = {}
        self.execution_pool = init_execution_pool(self.num_workers, self.enable_global_rate_limit, self.rate_limit)
        where = self.sandbox_fusion_url if not is_local(self.sandbox_fusion_url) else "the local sandbox"
        logger.info(
            "tool %s: code runs in %s; %d workers, at most %d at once (%s limit), timeout %s s, %d MB",
            self.name, where, self.num_workers, self.rate_limit, self.execution_pool.limiter.scope,
            self.default_timeout, self.memory_limit_mb,
        )  # fmt: skip

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema:
        """The schema in use; before one is set, the default ``code_interpreter`` schema (one string ``code``)."""
        return getattr(self, "tool_schema", None) or OpenAIFunctionToolSchema.model_validate(_DEFAULT_SCHEMA)

    async def create(
        self, instance_id: str | None = None, ground_truth: str | None = None, **kwargs: Any
    ) -> tuple[str, ToolResponse]:
        """Start an instance holding ``ground_truth`` and the rewards it collects."""
        instance_id = instance_id or str(uuid4())
        self._instance_dict[instance_id] = {"response": "", "ground_truth": ground_truth, "reward": []}
        return instance_id, ToolResponse()

    @rollout_trace_op
    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float | None, dict[str, Any] | None]:
        """Run ``parameters["code"]`` (with its ``timeout`` / ``language`` if given); no reward, no metrics."""
        code = parameters.get("code", "")
        timeout = parameters.get("timeout", self.default_timeout)
        language = parameters.get("language", self.default_language)
        if not isinstance(code, str):
            code = str(code)
        result = await self.execution_pool.execute.remote(self.execute_code, instance_id, code, timeout, language)
        if isinstance(result, ToolResponse):
            return result, None, None
        return ToolResponse(text=None if result is None else str(result)), None, None

    def execute_code(self, instance_id: str, code: str, timeout: float = 30, language: str = "python") -> ToolResponse:
        """Run ``code`` now (blocking; the pool calls it in a worker thread) and return what the model reads."""
        response, error = run_code(self.sandbox_fusion_url, code, timeout, self.memory_limit_mb, language)
        run_result = (response or {}).get("run_result") or {}
        if run_result.get("status") == "Finished":
            text = (run_result.get("stdout") or "") + (run_result.get("stderr") or "")
            logger.debug("tool %s, instance %s: %r", self.name, instance_id, text)
            return ToolResponse(text=text)
        reason = error or f"run status {run_result.get('status')!r}: {(response or {}).get('message', '')}"
        logger.warning("tool %s, instance %s: the code did not finish (%s)", self.name, instance_id, reason)
        return ToolResponse(text=NO_OUTPUT)

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> Any:
        """The rewards the instance collected (veRL returns the list as is)."""
        return self._instance_dict[instance_id]["reward"]

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        """Drop the instance."""
        self._instance_dict.pop(instance_id, None)
