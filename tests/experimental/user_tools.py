"""A veRL user's tools, plugged in by the tool YAML alone (``class_name: tests.experimental.user_tools.<Class>``).

Written the way veRL's docs show: per-instance state in ``create``, the ``create_kwargs`` from the sample's
``tools_kwargs``, ``(ToolResponse, reward, metrics)`` from ``execute``, cleanup in ``release``.
"""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import uuid4

from verl.tools.base_tool import BaseTool, ToolUnavailableError
from verl.tools.schemas import ToolResponse

RELEASED: list[str] = []


class EchoTool(BaseTool):
    """``echo(text)`` → ``text`` repeated ``config.repeat`` times, prefixed with the sample's ``create_kwargs.tag``."""

    def __init__(self, config: dict[str, Any], tool_schema: Any) -> None:
        super().__init__(config, tool_schema)
        self.repeat = int(config.get("repeat", 1))
        self._instances: dict[str, dict[str, Any]] = {}

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, ToolResponse]:
        instance_id = instance_id or str(uuid4())
        self._instances[instance_id] = {"tag": (kwargs.get("create_kwargs") or {}).get("tag", "")}
        return instance_id, ToolResponse()

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any):
        text = self._instances[instance_id]["tag"] + str(parameters["text"]) * self.repeat
        return ToolResponse(text=text), 0.5, {}

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        del self._instances[instance_id]
        RELEASED.append(instance_id)


class OldStyleTool(BaseTool):
    """veRL's older return types: ``create`` returns the id, ``execute`` a plain string and no metrics."""

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> str:
        return instance_id or "old"

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any):
        return f"old:{parameters.get('x')}", None, None


class BrokenTool(BaseTool):
    """Raises on every call (a bug in the tool): the model reads the error, the rollout goes on."""

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any):
        raise RuntimeError("the database is down")


class SlowTool(BaseTool):
    """Gives up after ``config.timeout`` seconds, as a tool with its own deadline does."""

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any):
        await asyncio.wait_for(asyncio.sleep(10), timeout=float(self.config.get("timeout", 0.05)))


class UnavailableTool(BaseTool):
    """Cannot run safely on this machine: the rollout must stop."""

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any):
        raise ToolUnavailableError("UnavailableTool: no isolation on this machine")


class NotATool:
    """Not a BaseTool: the YAML loader refuses it."""
