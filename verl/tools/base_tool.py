"""veRL's tool interface: :class:`BaseTool`.

A tool is built once per agent-loop worker from its entry in ``multi_turn.tool_config_path`` (``config`` and
``tool_schema``) and serves every conversation of that worker: per-call state lives under the ``instance_id`` that
:meth:`create` returns, until :meth:`release`. For each parsed call the tool agent loop does
``create(create_kwargs=...)`` → ``execute(instance_id, arguments, agent_data=...)`` → ``release(instance_id)``; an
exception in any of them becomes an error text for the model (the rollout goes on), except
:class:`ToolUnavailableError`, which stops the run.
"""

from __future__ import annotations

import json
import logging
from typing import Any
from uuid import uuid4

from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

__all__ = ["BaseTool", "ToolUnavailableError"]

logger = logging.getLogger(__name__)


class ToolUnavailableError(RuntimeError):
    """A tool cannot run as it promises on this machine (e.g. its sandbox cannot be set up). Unlike other
    failures, which the model reads as an error text, this one stops the rollout."""


class BaseTool:
    """Base class of tools.

    Args:
        config: the entry's ``config`` mapping (``type`` included).
        tool_schema: the entry's ``tool_schema`` (None: :meth:`get_openai_tool_schema` of the subclass provides it).
    """

    def __init__(self, config: dict[str, Any], tool_schema: OpenAIFunctionToolSchema | None) -> None:
        self.config = dict(config or {})
        self.tool_schema = tool_schema if tool_schema is not None else self.get_openai_tool_schema()
        if self.tool_schema is None:
            raise ValueError(f"{type(self).__name__}: no tool_schema given and get_openai_tool_schema() returns None")
        self.name = self.tool_schema.function.name
        logger.debug("tool %s: %s", self.name, json.dumps(self.tool_schema.model_dump(exclude_none=True)))

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema | None:
        """The OpenAI function schema shown to the model."""
        return getattr(self, "tool_schema", None)

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, ToolResponse]:
        """Start an instance (a call's state); returns its id and an initial response (usually empty)."""
        return (instance_id or str(uuid4())), ToolResponse()

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float | None, dict[str, Any] | None]:
        """Run the call with the model's ``parameters``; returns the response, a step reward and metrics."""
        return ToolResponse(text="Updated the tool state."), 0.0, {}

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        """The instance's reward (the tool agent loop does not call it; recipes may)."""
        return 0.0

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        """Drop the instance's state."""
