"""Tool-call parsers: find the calls in a model's response (``multi_turn.format``; veRL's ``hermes``).

Hermes format (Qwen2.5, Qwen3 and others)::

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "3 + 4"}}
    </tool_call>

A block whose JSON does not parse, or lacks ``name``, is not a call (as in veRL); :meth:`HermesToolParser.parse`
also returns why each such block was rejected, so the tool agent loop counts and reports it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from abc import ABC, abstractmethod
from typing import Any, ClassVar

from pydantic import BaseModel

__all__ = ["FunctionCall", "HermesToolParser", "ToolParser"]

logger = logging.getLogger(__name__)


class FunctionCall(BaseModel):
    """A parsed call: the function's name and its arguments as a JSON string."""

    arguments: str
    name: str


class ToolParser(ABC):
    """Base class of tool-call parsers; subclasses register under a ``multi_turn.format`` name."""

    _registry: ClassVar[dict[str, type[ToolParser]]] = {}

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    @abstractmethod
    async def extract_tool_calls(self, responses_ids: list[int]) -> tuple[str, list[FunctionCall]]:
        """The response's text without the calls, and the calls."""

    async def parse(self, responses_ids: list[int]) -> tuple[str, list[FunctionCall], list[str]]:
        """Like :meth:`extract_tool_calls`, plus one message per rejected call block (default: none known)."""
        content, calls = await self.extract_tool_calls(responses_ids)
        return content, calls, []

    @classmethod
    def get_tool_parser(cls, name: str, tokenizer: Any) -> ToolParser:
        """The parser registered as ``name``."""
        if name not in cls._registry:
            raise ValueError(f"Unknown tool parser: {name!r} (rollout.multi_turn.format); known: {cls.names()}")
        return cls._registry[name](tokenizer)

    @classmethod
    def names(cls) -> list[str]:
        """The registered parser names."""
        return sorted(cls._registry)

    @classmethod
    def register(cls, name: str):
        """Class decorator: make a parser available as ``multi_turn.format=name``."""

        def decorator(subclass: type[ToolParser]) -> type[ToolParser]:
            cls._registry[name] = subclass
            return subclass

        return decorator


@ToolParser.register("hermes")
class HermesToolParser(ToolParser):
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks."""

    tool_call_start_token = "<tool_call>"
    tool_call_end_token = "</tool_call>"
    _pattern = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)

    async def extract_tool_calls(self, responses_ids: list[int]) -> tuple[str, list[FunctionCall]]:
        content, calls, _ = await self.parse(responses_ids)
        return content, calls

    async def parse(self, responses_ids: list[int]) -> tuple[str, list[FunctionCall], list[str]]:
        loop = asyncio.get_running_loop()
        text = await loop.run_in_executor(None, self.tokenizer.decode, list(responses_ids))
        return self.parse_text(text)

    def parse_text(self, text: str) -> tuple[str, list[FunctionCall], list[str]]:
        """Parse decoded text: (content without the blocks, calls, rejected blocks' reasons)."""
        if self.tool_call_start_token not in text or self.tool_call_end_token not in text:
            return text, [], []
        calls: list[FunctionCall] = []
        rejected: list[str] = []
        for block in self._pattern.findall(text):
            try:
                call = json.loads(block)
                name, arguments = call["name"], call.get("arguments", {})
                if not isinstance(name, str):
                    raise TypeError("'name' is not a string")
            except (ValueError, KeyError, TypeError, AttributeError) as e:
                rejected.append(f"invalid tool call {block.strip()[:200]!r}: {type(e).__name__}: {e}")
                logger.debug("rejected tool call block %r: %s", block, e)
                continue
            calls.append(FunctionCall(name=name, arguments=json.dumps(arguments, ensure_ascii=False)))
        return self._pattern.sub("", text), calls, rejected
