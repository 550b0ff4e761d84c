"""Function tools (veRL's ``@function_tool``): a typed Python function with a Google-style docstring becomes a tool.

Point ``actor_rollout_ref.rollout.multi_turn.function_tool_path`` at a file of decorated functions::

    # my_tools.py
    from verl.tools.function_tool import function_tool


    @function_tool
    def get_weather(city: str, unit: str = "celsius") -> dict:
        '''Get the current weather of a city.

        Args:
            city: the city's name.
            unit: "celsius" or "fahrenheit".
        '''
        return {"city": city, "temperature": 17.5, "unit": unit}

The OpenAI function schema is inferred by :func:`transformers.utils.get_json_schema` (the helper chat templates use
for Python tools): ``name`` is the function's name (or the decorator's argument), ``description`` the docstring's
summary, one property per parameter with its JSON type from the annotation and its description from the ``Args:``
entry, and ``required`` the parameters without a default. A missing docstring, type hint or ``Args:`` entry, or a
``*args`` / ``**kwargs`` parameter, is an error when the decorator runs, naming the function.

A call runs the function with the model's arguments (a sync function in a worker thread) and
:func:`normalize_function_tool_return` turns its result into ``(ToolResponse, reward, metrics)``. Function tools are
stateless: no ``create`` / ``release``, and they do not receive the sample's ``tools_kwargs`` (write a
:class:`~verl.tools.base_tool.BaseTool` for per-sample state).
"""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import json
import logging
import os
import re
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

__all__ = [
    "FUNCTION_TOOL_REGISTRY",
    "FunctionTool",
    "function_tool",
    "get_function_tool",
    "load_function_tools_from_path",
    "normalize_function_tool_return",
]

logger = logging.getLogger(__name__)


@dataclass
class FunctionTool:
    """A registered function tool: what the tool agent loop needs (``name``, ``tool_schema``) and the function."""

    name: str
    fn: Callable[..., Any]
    tool_schema: OpenAIFunctionToolSchema
    is_async: bool = False

    @property
    def origin(self) -> str:
        """``module.qualname (file:line)`` of the function, for error messages."""
        return _origin(self.fn)

    async def call(self, parameters: dict[str, Any]) -> Any:
        """The function's result for the model's ``parameters`` (a sync function runs in a worker thread)."""
        if self.is_async:
            return await self.fn(**parameters)
        return await asyncio.to_thread(self.fn, **parameters)


# name → tool, for every @function_tool of the process (veRL's global registry)
FUNCTION_TOOL_REGISTRY: dict[str, FunctionTool] = {}
# absolute path → the tools its file registered: a file is executed once per process
_LOADED_FUNCTION_TOOL_PATHS: dict[str, list[FunctionTool]] = {}
_loading: list[list[FunctionTool]] = []  # the tools each file being loaded registers (innermost last)
_lock = threading.RLock()


def _origin(fn: Callable[..., Any]) -> str:
    code = getattr(fn, "__code__", None)
    where = f" ({code.co_filename}:{code.co_firstlineno})" if code is not None else ""
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}{where}"


def _same_definition(a: Callable[..., Any], b: Callable[..., Any]) -> bool:
    """One function, or the same source definition executed again (a file imported twice)."""
    if a is b:
        return True
    code_a, code_b = getattr(a, "__code__", None), getattr(b, "__code__", None)
    return (
        code_a is not None
        and code_b is not None
        and a.__qualname__ == b.__qualname__
        and (code_a.co_filename, code_a.co_firstlineno) == (code_b.co_filename, code_b.co_firstlineno)
    )


def _infer_schema(fn: Callable[..., Any], name: str) -> OpenAIFunctionToolSchema:
    where = f"@function_tool {name!r} ({_origin(fn)})"
    variadic = [
        p.name
        for p in inspect.signature(fn).parameters.values()
        if p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    ]
    if variadic:
        raise ValueError(
            f"{where}: variadic parameter(s) {variadic} cannot be described by a JSON schema; declare named "
            "parameters instead (e.g. items: list[str])"
        )
    from transformers.utils import get_json_schema

    try:
        raw = get_json_schema(fn)
    except Exception as e:  # noqa: BLE001 - transformers raises its own parsing exceptions
        raise ValueError(
            f"{where}: cannot infer the tool's schema: {e} (a function tool needs a Google-style docstring with an "
            "'Args:' entry and a type hint for every parameter)"
        ) from e
    raw["function"]["name"] = name
    raw["function"].pop("return", None)  # the documented return value is not part of the OpenAI schema
    return OpenAIFunctionToolSchema.model_validate(raw)


def _given_schema(
    schema: OpenAIFunctionToolSchema | dict[str, Any], fn: Callable[..., Any]
) -> OpenAIFunctionToolSchema:
    if isinstance(schema, OpenAIFunctionToolSchema):
        return schema
    try:
        return OpenAIFunctionToolSchema.model_validate(schema)
    except ValidationError as e:
        raise ValueError(f"@function_tool ({_origin(fn)}): schema= is not an OpenAI function schema: {e}") from e


def _register(fn: Callable[..., Any], name: str | None, schema: Any) -> Callable[..., Any]:
    if not callable(fn):
        raise TypeError(f"@function_tool decorates a function, got {fn!r}")
    if schema is not None:
        built = _given_schema(schema, fn)
        if name is not None and name != built.function.name:
            raise ValueError(
                f"@function_tool({name!r}) ({_origin(fn)}): the given schema names the function "
                f"{built.function.name!r}; the model calls the tool by the schema's name, so they must agree"
            )
        name = built.function.name
    else:
        name = name or fn.__name__
        built = _infer_schema(fn, name)
    tool = FunctionTool(name=name, fn=fn, tool_schema=built, is_async=inspect.iscoroutinefunction(fn))
    with _lock:
        existing = FUNCTION_TOOL_REGISTRY.get(name)
        if existing is not None and not _same_definition(existing.fn, fn):
            raise ValueError(
                f"@function_tool {name!r}: the name is already registered by {existing.origin}; {tool.origin} "
                "cannot take it too (pass another name: @function_tool('other_name'))"
            )
        FUNCTION_TOOL_REGISTRY[name] = tool
        if _loading:
            _loading[-1].append(tool)
    logger.debug("registered function tool %s from %s", name, tool.origin)
    return fn


def function_tool(
    name: str | Callable[..., Any] | None = None, *, schema: OpenAIFunctionToolSchema | dict[str, Any] | None = None
) -> Any:
    """Register a function as a tool; returns the function unchanged.

    ``@function_tool`` names the tool after the function, ``@function_tool("other")`` renames it, and
    ``@function_tool(schema={...})`` skips the inference and uses the given OpenAI function schema (the tool is then
    called by the schema's name).
    """
    if callable(name):  # bare @function_tool
        return _register(name, None, schema)
    return lambda fn: _register(fn, name, schema)


def get_function_tool(name: str) -> FunctionTool:
    """The registered function tool ``name``."""
    if name not in FUNCTION_TOOL_REGISTRY:
        raise KeyError(
            f"no function tool {name!r} is registered (registered: {sorted(FUNCTION_TOOL_REGISTRY)}); the file that "
            "defines it goes in actor_rollout_ref.rollout.multi_turn.function_tool_path"
        )
    return FUNCTION_TOOL_REGISTRY[name]


def load_function_tools_from_path(path: str) -> list[FunctionTool]:
    """The function tools the Python file at ``path`` registers (the file runs once per process; relative paths are
    taken from the working directory)."""
    abs_path = os.path.abspath(os.path.expanduser(str(path)))
    if not os.path.isfile(abs_path):
        raise FileNotFoundError(f"function_tool_path does not exist: {path} (looked at {abs_path})")
    with _lock:
        if abs_path in _LOADED_FUNCTION_TOOL_PATHS:
            return list(_LOADED_FUNCTION_TOOL_PATHS[abs_path])
        module_name = "_verl_function_tools_" + re.sub(r"\W", "_", abs_path)
        spec = importlib.util.spec_from_file_location(module_name, abs_path)
        if spec is None or spec.loader is None:
            raise ImportError(f"function_tool_path {path!r}: not an importable Python file")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        _loading.append([])
        try:
            spec.loader.exec_module(module)
        except Exception as e:
            sys.modules.pop(module_name, None)
            for tool in _loading[-1]:  # a half-run file leaves no tools behind
                if FUNCTION_TOOL_REGISTRY.get(tool.name) is tool:
                    del FUNCTION_TOOL_REGISTRY[tool.name]
            raise ImportError(f"function_tool_path {path!r}: {type(e).__name__}: {e}") from e
        finally:
            tools = _loading.pop()
        if not tools:
            logger.warning("function_tool_path %s: no @function_tool decorators found; no tools were added", path)
        else:
            logger.info("function tools from %s: %s", path, [t.name for t in tools])
        _LOADED_FUNCTION_TOOL_PATHS[abs_path] = tools
        return list(tools)


def _as_response(value: Any) -> ToolResponse:
    if isinstance(value, ToolResponse):
        return value
    if isinstance(value, str):
        return ToolResponse(text=value)
    if isinstance(value, dict):
        return ToolResponse(text=json.dumps(value, ensure_ascii=False))
    return ToolResponse(text=str(value))


def normalize_function_tool_return(ret: Any) -> tuple[ToolResponse, float, dict[str, Any]]:
    """A function tool's result as ``(ToolResponse, reward, metrics)``.

    ``ToolResponse`` as is; ``str`` as the text; ``dict`` as its JSON; a tuple ``(response,)``, ``(response, reward)``
    or ``(response, reward, metrics)`` (``None`` reward → 0.0, ``None`` metrics → {}); anything else as ``str(ret)``.
    A tuple of another length raises ``TypeError`` (almost always a bug in the tool).
    """
    if not isinstance(ret, tuple):
        return _as_response(ret), 0.0, {}
    if not 1 <= len(ret) <= 3:
        raise TypeError(
            f"a function tool returned a tuple of length {len(ret)}; a tuple must have length 1, 2, or 3: "
            f"(response,), (response, reward) or (response, reward, metrics) — got {ret!r:.200}"
        )
    reward = 0.0 if len(ret) < 2 or ret[1] is None else float(ret[1])
    metrics = {} if len(ret) < 3 or ret[2] is None else dict(ret[2])
    return _as_response(ret[0]), reward, metrics
