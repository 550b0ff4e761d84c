"""A calculator tool: evaluates an arithmetic expression (numbers, ``+ - * / // % **``, parentheses).

The expression is parsed with :mod:`ast` and only number literals and those operators are evaluated — no names,
calls or attributes — so it is safe to run in the worker. Exponents and results are bounded.
"""

from __future__ import annotations

import ast
import operator
from typing import Any

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

__all__ = ["CALCULATOR_SCHEMA", "CalculatorTool", "evaluate_expression"]

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_MAX_EXPONENT = 64
_MAX_MAGNITUDE = 10**30
_MAX_LENGTH = 200

CALCULATOR_SCHEMA = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression and return its value.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. 3 + 4 * (2 - 1)"}},
            "required": ["expression"],
        },
    },
}


def evaluate_expression(expression: str) -> int | float:
    """The value of an arithmetic expression; ``ValueError`` for anything else (names, calls, huge numbers)."""
    if len(expression) > _MAX_LENGTH:
        raise ValueError(f"expression longer than {_MAX_LENGTH} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as e:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from e
    return _eval(tree.body)


def _eval(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > _MAX_EXPONENT:
            raise ValueError(f"exponent {right} is too large")
        try:
            value = _BINARY[type(node.op)](left, right)
        except ZeroDivisionError as e:
            raise ValueError("division by zero") from e
        if isinstance(value, complex) or abs(value) > _MAX_MAGNITUDE:
            raise ValueError("result out of range")
        return value
    raise ValueError(f"unsupported element {type(node).__name__} in the expression")


def _format(value: int | float) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(round(value, 10)) if isinstance(value, float) else str(value)


class CalculatorTool(BaseTool):
    """``calculator(expression)`` → the value as text (``"7"``), or ``"Error: ..."`` for a bad expression."""

    def __init__(self, config: dict[str, Any], tool_schema: OpenAIFunctionToolSchema | None = None) -> None:
        unknown = sorted(set(config or {}) - {"type"})
        if unknown:
            raise ValueError(f"CalculatorTool: unknown config keys {unknown}")
        super().__init__(config, tool_schema)

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema:
        """The default schema: ``calculator`` with one string parameter ``expression``."""
        return getattr(self, "tool_schema", None) or OpenAIFunctionToolSchema.model_validate(CALCULATOR_SCHEMA)

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict[str, Any]]:
        """Evaluate ``parameters["expression"]``."""
        expression = parameters.get("expression")
        if not isinstance(expression, str):
            return ToolResponse(text="Error: the parameter 'expression' (a string) is required"), 0.0, {"error": True}
        try:
            value = evaluate_expression(expression)
        except ValueError as e:
            return ToolResponse(text=f"Error: {e}"), 0.0, {"error": True}
        return ToolResponse(text=_format(value)), 0.0, {"error": False}
