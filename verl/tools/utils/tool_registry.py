"""veRL's older import path of the tool registry: everything lives in :mod:`verl.tools.tool_registry`."""

from verl.tools.tool_registry import (
    ToolType,
    get_tool_class,
    initialize_tools_from_config,
    load_all_tools,
    load_subclass,
)

__all__ = ["ToolType", "get_tool_class", "initialize_tools_from_config", "load_all_tools", "load_subclass"]
