"""Rollout tracing at veRL's names: each traced agent-loop call (``@rollout_trace_op``) becomes a span or call in a
tracing backend, grouped by the sample it belongs to (``rollout_trace_attr``).

Backends (``actor_rollout_ref.rollout.trace.backend``):

- ``mlflow``: a span per call (inputs, outputs) inside one span per sample, tagged with the sample's attributes;
  the tracking URI is ``MLFLOW_TRACKING_URI`` (default ``sqlite:////tmp/mlruns.db``), the experiment the project;
- ``weave``: a call per op on ``weave.init(project)``'s client, the sample's attributes as call attributes;
- ``trackio``: one ``trackio.Trace`` per call (a chat: the call's ``messages`` and the reply when it has them, else
  the op's inputs and output), logged at the sample's step; a run is started when none is active;
- ``dummy``: attributes are scoped but nothing is recorded; ``None``: off (the default).

``token2text`` adds the decoded ``prompt_text`` / ``response_text`` to a traced output (the instance's
``tokenizer``); ``max_samples_per_step_per_worker`` is read by the agent-loop worker, which picks the samples to trace.
A ``rollout_trace_attr(..., trace=False)`` block turns every op inside it off.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import json
import logging
import os
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any, ClassVar

logger = logging.getLogger(__name__)

BACKENDS = (None, "dummy", "mlflow", "weave", "trackio")
DEFAULT_MLFLOW_URI = "sqlite:////tmp/mlruns.db"

_trace_enabled: ContextVar[bool] = ContextVar("_trace_enabled", default=True)
_trace_attributes: ContextVar[dict[str, Any] | None] = ContextVar("_trace_attributes", default=None)


class RolloutTraceConfig:
    """The process's rollout-trace settings (one per process, as veRL's singleton); `init` sets them once."""

    _instance: ClassVar[RolloutTraceConfig | None] = None
    backend: str | None = None
    client: Any = None
    token2text: bool = False
    project_name: str | None = None
    experiment_name: str | None = None
    max_samples_per_step_per_worker: int | None = None
    _initialized: bool = False

    @classmethod
    def get_instance(cls) -> RolloutTraceConfig:
        """The process's settings."""
        if cls._instance is None:
            cls._instance = cls()
        return cls._instance

    @classmethod
    def init(
        cls,
        project_name: str | None,
        experiment_name: str | None,
        backend: str | None,
        token2text: bool = False,
        max_samples_per_step_per_worker: int | None = None,
    ) -> None:
        """Set the settings and connect the backend's client; later calls in the process change nothing."""
        config = cls.get_instance()
        wanted = (backend, project_name, experiment_name, bool(token2text), max_samples_per_step_per_worker)
        if config._initialized:
            held = (config.backend, config.project_name, config.experiment_name, config.token2text)
            if wanted[:4] != held:
                logger.warning("rollout tracing was set up in this process as %s; %s is not applied", held, wanted)
            return
        if backend not in BACKENDS:
            raise ValueError(f"rollout.trace.backend={backend!r}; use one of {list(BACKENDS)}")
        if max_samples_per_step_per_worker is not None and max_samples_per_step_per_worker < 0:
            raise ValueError(
                f"rollout.trace.max_samples_per_step_per_worker={max_samples_per_step_per_worker}: "
                "a non-negative number or null"
            )
        config.backend, config.token2text = backend, bool(token2text)
        config.project_name, config.experiment_name = project_name, experiment_name
        config.max_samples_per_step_per_worker = max_samples_per_step_per_worker
        config.client = _connect(backend, project_name, experiment_name)
        config._initialized = True
        if backend is not None:
            logger.info("rollout tracing to %s (project %r, experiment %r)", backend, project_name, experiment_name)

    @classmethod
    def get_backend(cls) -> str | None:
        """The tracing backend (None: off)."""
        return cls.get_instance().backend

    @classmethod
    def get_client(cls) -> Any:
        """The backend's client (weave's client, the mlflow or trackio module; None without a backend)."""
        return cls.get_instance().client

    @classmethod
    def enable_token2text(cls) -> bool:
        """Whether traced outputs carry the decoded prompt and response."""
        return cls.get_instance().token2text

    @classmethod
    def reset(cls) -> None:
        """Forget the settings (tests)."""
        cls._instance = None


def _connect(backend: str | None, project: str | None, experiment: str | None) -> Any:
    if backend == "weave":
        import weave

        return weave.init(project)
    if backend == "mlflow":
        import mlflow

        mlflow.config.enable_async_logging()
        mlflow.set_tracking_uri(os.environ.get("MLFLOW_TRACKING_URI", DEFAULT_MLFLOW_URI))
        mlflow.set_experiment(project)
        return mlflow
    if backend == "trackio":
        import trackio
        from trackio import context_vars

        if context_vars.current_run.get() is None:  # the run's own tracker may have started one
            trackio.init(project=project, name=experiment, config={"framework": "verl"})
        return trackio
    return None


@contextlib.contextmanager
def rollout_trace_attr(
    sample_index: Any = None,
    step: int | None = None,
    rollout_n: int | None = None,
    name: str = "rollout_trace",
    validate: bool = False,
    trace: bool = True,
) -> Iterator[None]:
    """Scope one sample: the traced ops inside carry its attributes (mlflow: they nest in one span ``name``);
    ``trace=False`` turns tracing off inside the block."""
    backend = RolloutTraceConfig.get_backend()
    if backend is None:
        yield
        return
    if not trace:
        token = _trace_enabled.set(False)
        try:
            yield
        finally:
            _trace_enabled.reset(token)
        return
    given = {"sample_index": sample_index, "step": step, "rollout_n": rollout_n}
    attributes = {k: v for k, v in given.items() if v is not None}
    attributes["validate"] = validate
    attributes["experiment_name"] = RolloutTraceConfig.get_instance().experiment_name
    token = _trace_attributes.set(attributes)
    try:
        if backend == "weave":
            import weave

            with weave.attributes(attributes):
                yield
        elif backend == "mlflow":
            import mlflow

            with mlflow.start_span(name=name) as span:
                for key, value in attributes.items():
                    mlflow.set_trace_tag(span.trace_id, str(key), str(value))
                yield
        else:
            yield
    finally:
        _trace_attributes.reset(token)


def _attributes() -> dict[str, Any]:
    if RolloutTraceConfig.get_backend() == "weave":
        from weave.trace.context import call_context

        return dict(call_context.call_attributes.get())
    return dict(_trace_attributes.get() or {})


def _as_dict(value: Any) -> dict[str, Any] | None:
    """A copy of an output as a dict (pydantic models, dicts, plain objects); None for anything else."""
    if hasattr(value, "model_dump"):
        return value.model_dump()
    if isinstance(value, dict):
        return dict(value)
    if hasattr(value, "__dict__"):
        return dict(vars(value))
    return None


def _field(value: Any, name: str) -> Any:
    return value.get(name) if isinstance(value, dict) else getattr(value, name, None)


def _with_text(instance: Any, inputs: dict[str, Any], output: Any) -> Any:
    """``output`` with ``prompt_text`` / ``response_text`` decoded by ``instance.tokenizer`` (agent-loop outputs
    carry ``prompt_ids`` / ``response_ids``; a generate call takes ``prompt_ids`` and returns ``token_ids``)."""
    decode = getattr(getattr(instance, "tokenizer", None), "decode", None)
    prompt = _field(output, "prompt_ids")
    prompt = inputs.get("prompt_ids") if prompt is None else prompt
    response = _field(output, "response_ids")
    response = _field(output, "token_ids") if response is None else response
    copy = _as_dict(output)
    if not callable(decode) or copy is None or (prompt is None and response is None):
        return output
    if prompt is not None:
        copy["prompt_text"] = decode(prompt)
    if response is not None:
        copy["response_text"] = decode(response)
    return copy


def _plain(value: Any) -> Any:
    """``value`` as JSON-able metadata (models dumped, unknown objects as their ``str``)."""
    if hasattr(value, "model_dump"):
        value = value.model_dump()
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return str(value)


def _log_trackio(op: str, inputs: dict[str, Any], output: Any = None, error: BaseException | None = None) -> None:
    """One ``trackio.Trace``: the call's chat (its ``messages`` and the reply) when it has one, else its inputs and
    output as a chat; the sample's attributes, the other inputs and the output as metadata."""
    trackio = RolloutTraceConfig.get_client()
    attributes = _attributes()
    result = _as_dict(output)
    metadata = {
        "op": op,
        "backend": "trackio",
        "experiment_name": RolloutTraceConfig.get_instance().experiment_name,
        "inputs": _plain({k: v for k, v in inputs.items() if k != "messages"}),
        **{k: _plain(v) for k, v in attributes.items()},
    }
    if error is None:
        metadata.update(status="success", output=_plain(result if result is not None else output))
    else:
        metadata.update(status="error", exception_type=type(error).__name__)
    given = inputs.get("messages")
    messages = [dict(m) for m in given if isinstance(m, dict) and isinstance(m.get("role"), str)] if given else []
    if not messages:
        messages = [
            {"role": "system", "content": f"verl rollout trace operation: {op}"},
            {"role": "user", "content": json.dumps({"inputs": _plain(inputs)}, ensure_ascii=False)},
        ]
    if error is not None:
        reply = json.dumps({"exception_type": type(error).__name__, "exception": str(error)}, ensure_ascii=False)
    elif result is not None and (result.get("response_text") or result.get("answer")):
        reply = str(result.get("response_text") or result.get("answer"))
    else:
        reply = json.dumps({"output": _plain(output)}, ensure_ascii=False)
    messages.append({"role": "assistant", "content": reply})
    key = "rollout_trace/" + "".join(c if c.isalnum() or c in "._-" else "_" for c in op)
    step = attributes.get("step")
    trackio.log({key: trackio.Trace(messages=messages, metadata=metadata)}, step=None if step is None else int(step))


class _Call:
    """One traced call in the configured backend: `open` before, `close` after (with the output or the error)."""

    def __init__(self, op: str, instance: Any, inputs: dict[str, Any]) -> None:
        self.op, self.instance, self.inputs = op, instance, inputs
        self.backend = RolloutTraceConfig.get_backend()
        self._handle: Any = None
        self._span: Any = None

    def open(self) -> None:
        if self.backend == "weave":
            client = RolloutTraceConfig.get_client()
            self._handle = client.create_call(op=self.op, inputs=self.inputs, attributes=_attributes())
        elif self.backend == "mlflow":
            import mlflow

            self._span = mlflow.start_span(name=self.op)
            span = self._span.__enter__()
            span.set_inputs(self.inputs)
            self._handle = span

    def close(self, output: Any = None, error: BaseException | None = None) -> None:
        """Record ``output`` (already with its decoded text where ``token2text`` asks) or ``error``."""
        if self.backend == "weave":
            client = RolloutTraceConfig.get_client()
            if error is None:
                client.finish_call(self._handle, output=output)
            else:
                client.finish_call(self._handle, exception=error)
        elif self.backend == "mlflow":
            if error is None:
                self._handle.set_outputs(output)
                self._span.__exit__(None, None, None)
            else:
                self._span.__exit__(type(error), error, error.__traceback__)
        elif self.backend == "trackio":
            _log_trackio(self.op, self.inputs, output=output, error=error)


def _begin(func: Callable, args: tuple, kwargs: dict) -> _Call | None:
    """The call to trace, or None (tracing off, no backend, ``dummy``)."""
    if not _trace_enabled.get() or RolloutTraceConfig.get_backend() in (None, "dummy"):
        return None
    bound = inspect.signature(func).bind(*args, **kwargs)
    bound.apply_defaults()
    inputs = dict(bound.arguments)
    instance = inputs.pop("self", None)
    call = _Call(func.__qualname__, instance, inputs)
    call.open()
    return call


def rollout_trace_op(func: Callable) -> Callable:
    """Trace each call of a method (sync or async): its bound arguments (``self`` left out) and its output or error,
    as an op named ``Class.method``; without a backend, or inside ``rollout_trace_attr(trace=False)``, it runs as is."""
    if inspect.iscoroutinefunction(func):

        @functools.wraps(func)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            call = _begin(func, args, kwargs)
            if call is None:
                return await func(*args, **kwargs)
            try:
                result = await func(*args, **kwargs)
            except BaseException as e:
                call.close(error=e)
                raise
            traced = result
            if RolloutTraceConfig.enable_token2text():  # decoding may take a while: off the event loop
                traced = await asyncio.get_running_loop().run_in_executor(
                    None, _with_text, call.instance, call.inputs, result
                )
            call.close(traced)
            return result

        return async_wrapper

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        call = _begin(func, args, kwargs)
        if call is None:
            return func(*args, **kwargs)
        try:
            result = func(*args, **kwargs)
        except BaseException as e:
            call.close(error=e)
            raise
        call.close(_with_text(call.instance, call.inputs, result) if RolloutTraceConfig.enable_token2text() else result)
        return result

    return wrapper
