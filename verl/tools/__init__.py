"""Tools for multi-turn rollouts (veRL's ``verl.tools``): :class:`~verl.tools.base_tool.BaseTool`, the schemas,
function tools (:mod:`verl.tools.function_tool`), the built-in tools (a calculator, a sandboxed Python interpreter)
and the loader of both kinds in :mod:`verl.tools.tool_registry` (veRL's older path: ``verl.tools.utils``)."""
