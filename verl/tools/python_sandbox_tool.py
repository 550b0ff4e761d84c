"""A sandboxed Python interpreter tool (veRL's ``code_interpreter``): runs the model's ``code`` in a
:class:`~verl.tools.sandbox.PythonSandbox` and answers with its stdout and stderr.

Tool YAML ``config`` keys (all optional): the :class:`~verl.tools.sandbox.SandboxLimits` fields (``cpu_seconds``,
``wall_seconds``, ``memory_mb``, ``output_bytes``, ``max_processes``, ``max_file_mb``, ``tmpfs_mb``),
``max_concurrency`` (simultaneous sandboxes per tool, default 4) and ``unshare_path`` (default ``unshare``).
The constructor verifies the isolation once, so a machine without it fails at start-up with
:class:`~verl.tools.sandbox.SandboxUnavailableError`; that error also propagates from :meth:`execute`.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import fields
from typing import Any

from verl.tools.base_tool import BaseTool
from verl.tools.sandbox import PythonSandbox, SandboxLimits
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

__all__ = ["PythonSandboxTool"]

logger = logging.getLogger(__name__)

_LIMIT_KEYS = frozenset(spec.name for spec in fields(SandboxLimits))
_OTHER_KEYS = frozenset({"type", "max_concurrency", "unshare_path"})
_DEFAULT_SCHEMA = {
    "type": "function",
    "function": {
        "name": "code_interpreter",
        "description": "Run Python code in a sandbox and return its stdout and stderr.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "The Python code to run."}},
            "required": ["code"],
        },
    },
}
_MISSING_CODE = "Error: the 'code' parameter (a string of Python code) is required."


class PythonSandboxTool(BaseTool):
    """Runs the model's Python code in a fresh sandbox per call; see the module docstring for the config."""

    def __init__(self, config: dict[str, Any], tool_schema: OpenAIFunctionToolSchema | None = None) -> None:
        super().__init__(config, tool_schema)
        unknown = sorted(set(self.config) - _LIMIT_KEYS - _OTHER_KEYS)
        if unknown:
            allowed = ", ".join(sorted(_LIMIT_KEYS | _OTHER_KEYS))
            raise ValueError(f"PythonSandboxTool: unknown config key {unknown[0]!r} (allowed: {allowed})")
        max_concurrency = self.config.get("max_concurrency", 4)
        if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int) or max_concurrency < 1:
            raise ValueError(f"PythonSandboxTool: max_concurrency must be a positive integer, got {max_concurrency!r}")
        limits = SandboxLimits(**{key: value for key, value in self.config.items() if key in _LIMIT_KEYS})
        self.sandbox = PythonSandbox(limits, unshare_path=str(self.config.get("unshare_path", "unshare")))
        self.sandbox.check()
        self._slots = asyncio.Semaphore(max_concurrency)
        logger.info("tool %s: python sandbox with %s, at most %d at once", self.name, limits, max_concurrency)

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema:
        """The schema in use; before one is set, the default ``code_interpreter`` schema (one string ``code``)."""
        return getattr(self, "tool_schema", None) or OpenAIFunctionToolSchema.model_validate(_DEFAULT_SCHEMA)

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict[str, Any]]:
        """Run ``parameters["code"]``; returns its output text, reward 0.0 and run metrics."""
        code = parameters.get("code") if isinstance(parameters, dict) else None
        if not isinstance(code, str):
            metrics = {"exit_code": None, "timed_out": False, "error": True, "output_truncated": False}
            return ToolResponse(text=_MISSING_CODE), 0.0, metrics
        async with self._slots:
            result = await self.sandbox.run(code)
        metrics = {
            "exit_code": result.exit_code,
            "timed_out": result.timed_out,
            "error": result.error is not None,
            "output_truncated": result.output_truncated,
        }
        return ToolResponse(text=result.to_text()), 0.0, metrics
