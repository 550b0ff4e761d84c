"""Build tools from veRL's tool YAML (``multi_turn.tool_config_path``)::

    tools:
      - class_name: verl.tools.calculator_tool.CalculatorTool   # any importable BaseTool subclass
        config: {type: native, ...}                             # passed to the constructor as a dict
        tool_schema:                                            # OpenAI function schema (optional if the class has one)
          type: function
          function: {name: calculator, description: ..., parameters: {type: object, properties: {...}, required: [...]}}

``config.type`` is ``native`` (MCP tools, veRL's ``mcp``, are not supported here and are refused). Every problem —
a missing file, YAML that does not parse, an entry without ``class_name``, a class that does not import or is not a
:class:`~verl.tools.base_tool.BaseTool`, a schema that does not validate, two tools with one name — raises an error
naming the file and the entry.

:func:`load_all_tools` adds the function tools of ``multi_turn.function_tool_path``
(:mod:`verl.tools.function_tool`) to the YAML's; a name defined in both is an error naming both. veRL's older path
``verl.tools.utils.tool_registry`` re-exports this module.
"""

from __future__ import annotations

import importlib
import logging
import sys
from enum import Enum
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from pydantic import ValidationError

from verl.tools.base_tool import BaseTool, ToolUnavailableError
from verl.tools.function_tool import FunctionTool, load_function_tools_from_path
from verl.tools.schemas import OpenAIFunctionToolSchema
from verl.utils.config import load_yaml_file

__all__ = ["ToolType", "get_tool_class", "initialize_tools_from_config", "load_all_tools", "load_subclass"]

logger = logging.getLogger(__name__)


class ToolType(Enum):
    """How a tool is provided: ``native`` (a Python class) or ``mcp`` (an MCP server; not supported here)."""

    NATIVE = "native"
    MCP = "mcp"


def get_tool_class(cls_name: str) -> type:
    """The class at the dotted path ``cls_name`` (``package.module.ClassName``)."""
    module_name, _, class_name = cls_name.rpartition(".")
    if not module_name:
        raise ImportError(f"{cls_name!r} is not a dotted path package.module.ClassName")
    module = sys.modules.get(module_name) or importlib.import_module(module_name)
    try:
        return getattr(module, class_name)
    except AttributeError as e:
        raise ImportError(f"module {module_name!r} has no class {class_name!r}") from e


def load_subclass(cls_name: str, base: type, where: str) -> type:
    """The class at ``cls_name``, which must subclass ``base``; errors start with ``where`` (file and entry)."""
    try:
        cls = get_tool_class(cls_name)
    except ImportError as e:
        raise ImportError(f"{where}: cannot import {cls_name!r}: {e}") from e
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise TypeError(f"{where}: {cls_name} is not a {base.__module__}.{base.__qualname__} subclass")
    return cls


def _plain(node: Any) -> Any:
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, (DictConfig, ListConfig)) else node


def _build(path: str, index: int, item: Any) -> BaseTool:
    where = f"tool config {path!r}, tools[{index}]"
    if not isinstance(item, DictConfig) or not item.get("class_name"):
        raise ValueError(f"{where}: needs 'class_name' (and 'config', 'tool_schema'), got {item!r}")
    config = _plain(item.get("config")) or {}
    if not isinstance(config, dict):
        raise ValueError(f"{where}: 'config' must be a mapping, got {config!r}")
    kind = config.get("type", ToolType.NATIVE.value)
    if kind != ToolType.NATIVE.value:
        raise ValueError(f"{where}: config.type={kind!r} is not supported; use {ToolType.NATIVE.value!r}")
    cls = load_subclass(str(item.class_name), BaseTool, where)
    schema = None
    if item.get("tool_schema") is not None:
        try:
            schema = OpenAIFunctionToolSchema.model_validate(_plain(item.tool_schema))
        except ValidationError as e:
            raise ValueError(f"{where}: tool_schema is not an OpenAI function schema: {e}") from e
    try:
        return cls(config=config, tool_schema=schema)
    except Exception as e:
        message = f"{where} ({item.class_name}): {type(e).__name__}: {e}"
        if isinstance(e, ToolUnavailableError):  # keeps its type: the machine cannot run the tool
            raise type(e)(message) from e
        raise ValueError(message) from e


def initialize_tools_from_config(tools_config_file: str) -> list[BaseTool]:
    """The tools listed in the YAML file ``tools_config_file`` (see the module docstring for the schema)."""
    config = load_yaml_file(tools_config_file, f"tool config {tools_config_file!r}")
    if not isinstance(config, DictConfig) or not isinstance(config.get("tools"), ListConfig):
        raise ValueError(f"tool config {tools_config_file!r}: must have a top-level 'tools' list")
    tools = [_build(tools_config_file, i, item) for i, item in enumerate(config.tools)]
    names = [tool.name for tool in tools]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"tool config {tools_config_file!r}: two tools are named {duplicates}")
    logger.info("tools from %s: %s", tools_config_file, names)
    return tools


def load_all_tools(
    tool_config_path: str | None = None,
    function_tool_path: str | None = None,
    *,
    tools_config_file: str | None = None,
) -> list[BaseTool | FunctionTool]:
    """The YAML tools of ``tool_config_path`` followed by the ``@function_tool`` s of the file ``function_tool_path``
    (either may be None: no tools of that kind). ``tools_config_file`` is another name of ``tool_config_path``.

    Raises:
        ValueError: a function tool has the name of a YAML tool (the error names both).
    """
    if tools_config_file is not None:
        if tool_config_path is not None and tool_config_path != tools_config_file:
            raise ValueError(
                f"load_all_tools: tool_config_path={tool_config_path!r} and tools_config_file={tools_config_file!r} "
                "name two files; give one"
            )
        tool_config_path = tools_config_file
    yaml_tools = initialize_tools_from_config(tool_config_path) if tool_config_path else []
    function_tools = load_function_tools_from_path(function_tool_path) if function_tool_path else []
    by_name = {tool.name: tool for tool in yaml_tools}
    clashes = [
        f"{tool.name!r} is {type(by_name[tool.name]).__module__}.{type(by_name[tool.name]).__qualname__} in "
        f"tool_config_path {tool_config_path!r} and @function_tool {tool.origin} in function_tool_path "
        f"{function_tool_path!r}"
        for tool in function_tools
        if tool.name in by_name
    ]
    if clashes:
        names = sorted({tool.name for tool in function_tools if tool.name in by_name})
        raise ValueError(
            f"function tool names {names} collide with tools of tool_config_path; tool names must be unique across "
            "multi_turn.tool_config_path and multi_turn.function_tool_path: "
            + "; ".join(clashes)
            + " — rename one of them"
        )
    return [*yaml_tools, *function_tools]
