"""veRL's ``verl.workers.rollout.schemas``: the chat message of a multi-turn rollout and its enums.

``Message`` is what veRL's tool agents and interactions build (``role``, ``content`` as text, a content part or
parts, or a `ToolResponse`, and the assistant's ``tool_calls``); ``Message(...).model_dump()`` is the dict a chat
template takes.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from pydantic import BaseModel

from verl.tools.schemas import OpenAIFunctionToolCall, ToolResponse

__all__ = ["AsyncRolloutRequestStateEnum", "FinishReasonTypeEnum", "Message"]


class FinishReasonTypeEnum(str, Enum):
    """Why a generation ended."""

    LENGTH = "length"
    STOP = "stop"
    TOOL_CALL = "tool_calls"

    @classmethod
    def from_str(cls, value: str) -> FinishReasonTypeEnum:
        """The member for ``value``; another value raises ``ValueError`` naming it."""
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"Unsupported finish reason type: {value!r} (one of {[m.value for m in cls]})") from None


class Message(BaseModel):
    """One chat message."""

    role: str
    content: str | dict[str, Any] | list[dict[str, Any]] | ToolResponse
    tool_calls: list[OpenAIFunctionToolCall] | None = None


class AsyncRolloutRequestStateEnum(str, Enum):
    """The state of a multi-turn request."""

    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    TOOL_CALLING = "tool_calling"
    INTERACTING = "interacting"
