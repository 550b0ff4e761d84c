"""Tools for multi-turn rollouts (veRL's ``verl.tools``): :class:`~verl.tools.base_tool.BaseTool`, the schemas,
the built-in tools (a calculator, a sandboxed Python interpreter) and the YAML loader in
:mod:`verl.tools.utils.tool_registry`."""
