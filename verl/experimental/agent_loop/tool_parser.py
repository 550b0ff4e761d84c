"""Tool-call parsers: find the calls in a model's response (``rollout.multi_turn.format``, veRL's names).

=============== ======================================================================================================
format          what the model writes
=============== ======================================================================================================
``hermes``      ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (Qwen2.5, Qwen3, and many others)
``gpt-oss``     harmony messages ``<|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json
                <|message|>{...}<|call|>``
``qwen3_coder`` ``<tool_call><function=NAME><parameter=KEY>VALUE</parameter></function></tool_call>``
``glm``         ``<tool_call>NAME<arg_key>KEY</arg_key><arg_value>VALUE</arg_value></tool_call>`` (GLM-4.5 and later)
``seed``        ``<seed:tool_call><function=NAME><parameter=KEY>VALUE</parameter></function></seed:tool_call>``
``minimax``     ``<minimax:tool_call><invoke name="NAME"><parameter name="KEY">VALUE</parameter></invoke>…``
``kimi``        ``<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:0<|tool_call_argument_begin|>{...}
                <|tool_call_end|><|tool_calls_section_end|>`` (the emitted id is kept as the call's id)
``deepseek_v4`` ``<｜DSML｜tool_calls><｜DSML｜invoke name="NAME"><｜DSML｜parameter name="KEY" string="true">…``
``gemma4``      ``<|tool_call>call:NAME{key:<|"|>text<|"|>,n:5}<tool_call|>``
=============== ======================================================================================================

The formats after ``gpt-oss`` live in :mod:`verl.experimental.agent_loop.model_tool_parsers` and are importable from
here too, as in veRL. Every parser has veRL's ``await extract_tool_calls(responses_ids, tools=None) -> (content,
[FunctionCall])`` and ``stop_token_ids`` (tokens the model does not follow with EOS after a call, so generation must
stop on them), plus :meth:`ToolParser.parse`, which also returns why each malformed call block was rejected so that
the tool agent loop counts and reports it. ``tools`` (the tools' OpenAI schemas) lets the XML formats type the
values they read as text.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import re
from typing import Any, ClassVar

from pydantic import BaseModel

# the other formats' parsers (KimiToolParser, ...) are importable from here too, through __getattr__ below
__all__ = ["FunctionCall", "GptOssToolParser", "HermesToolParser", "ToolParser"]

logger = logging.getLogger(__name__)

Parsed = tuple[str, list["FunctionCall"], list[str]]


class FunctionCall(BaseModel):
    """A parsed call: the function's name, its arguments as a JSON string, and the id the model gave the call (the
    tool's answer quotes it; None for formats without ids)."""

    arguments: str
    name: str
    tool_call_id: str | None = None


class ToolParser:
    """Base class of tool-call parsers; subclasses register under a ``multi_turn.format`` name.

    A subclass implements :meth:`parse_text` (the decoded response → content, calls, rejected blocks), or, as in
    veRL, overrides :meth:`extract_tool_calls` itself.
    """

    _registry: ClassVar[dict[str, type[ToolParser]]] = {}
    _extract_takes_tools: ClassVar[bool] = True

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if all(getattr(cls, m) is getattr(ToolParser, m) for m in ("extract_tool_calls", "parse", "parse_text")):
            raise TypeError(
                f"{cls.__qualname__}: a tool parser implements parse_text(text, tools=None) or "
                "extract_tool_calls(responses_ids, tools=None)"
            )
        parameters = inspect.signature(cls.extract_tool_calls).parameters.values()
        cls._extract_takes_tools = len(parameters) >= 3 or any(p.kind == p.VAR_POSITIONAL for p in parameters)

    @property
    def stop_token_ids(self) -> list[int]:
        """Token ids that must stop generation so the calls can run (default: none, the model ends with EOS)."""
        return []

    def token_ids(self, *tokens: str) -> list[int]:
        """The ids of those ``tokens`` that are single tokens of the vocabulary."""
        if self.tokenizer is None:
            return []
        ids = []
        unknown = getattr(self.tokenizer, "unk_token_id", None)
        for token in tokens:
            token_id = self.tokenizer.convert_tokens_to_ids(token)
            if isinstance(token_id, int) and token_id >= 0 and token_id != unknown:
                ids.append(token_id)
        return ids

    def decode(self, responses_ids: list[int]) -> str:
        """The response as text, special tokens kept (they delimit the calls of several formats), without the EOS /
        padding it ends with."""
        text = self.tokenizer.decode(list(responses_ids), skip_special_tokens=False)
        ends = [
            t for t in (getattr(self.tokenizer, "eos_token", None), getattr(self.tokenizer, "pad_token", None)) if t
        ]
        stripped = None
        while stripped != text:
            stripped = text
            for end in ends:
                text = text.removesuffix(end)
        return text

    async def extract_tool_calls(self, responses_ids: list[int], tools: list[Any] | None = None) -> tuple[str, list]:
        """veRL's method: the response's text without the calls, and the calls."""
        content, calls, _ = await self.parse(responses_ids, tools)
        return content, calls

    async def parse(self, responses_ids: list[int], tools: list[Any] | None = None) -> Parsed:
        """Like :meth:`extract_tool_calls`, plus one message per rejected (malformed) call block."""
        if type(self).extract_tool_calls is not ToolParser.extract_tool_calls:  # a parser written to veRL's API
            args = (responses_ids, tools) if self._extract_takes_tools else (responses_ids,)
            content, calls = await self.extract_tool_calls(*args)
            return content, list(calls), []
        text = await asyncio.get_running_loop().run_in_executor(None, self.decode, list(responses_ids))
        return self.parse_text(text, tools)

    def parse_text(self, text: str, tools: list[Any] | None = None) -> Parsed:
        """Parse decoded text: (content, calls, rejected blocks' reasons)."""
        raise NotImplementedError(f"{type(self).__qualname__} does not parse text")

    def tool_response_text(self, messages: list[dict[str, Any]], calls: list[FunctionCall]) -> str | None:
        """The text of a tool turn, for formats whose chat template cannot render tool messages on their own;
        None (the default): the chat template renders them."""
        return None

    @classmethod
    def get_tool_parser(cls, name: str, tokenizer: Any) -> ToolParser:
        """The parser registered as ``name``."""
        _load_builtin_parsers()
        if name not in cls._registry:
            raise ValueError(f"Unknown tool parser: {name!r} (rollout.multi_turn.format); known: {cls.names()}")
        return cls._registry[name](tokenizer)

    @classmethod
    def names(cls) -> list[str]:
        """The registered parser names."""
        _load_builtin_parsers()
        return sorted(cls._registry)

    @classmethod
    def register(cls, name: str):
        """Class decorator: make a parser available as ``multi_turn.format=name``."""

        def decorator(subclass: type[ToolParser]) -> type[ToolParser]:
            cls._registry[name] = subclass
            return subclass

        return decorator


def json_arguments(text: str) -> str:
    """Arguments written as JSON: re-serialized when they are a JSON object, else passed on as written (the tool
    agent loop answers the model that they are not a JSON object)."""
    try:
        value = json.loads(text)
    except ValueError:
        return text.strip()
    return json.dumps(value, ensure_ascii=False) if isinstance(value, dict) else text.strip()


@ToolParser.register("hermes")
class HermesToolParser(ToolParser):
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks; one that does not parse, or lacks
    ``name``, is not a call (as in veRL) and is reported as rejected."""

    tool_call_start_token = "<tool_call>"
    tool_call_end_token = "</tool_call>"
    _pattern = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)

    def parse_text(self, text: str, tools: list[Any] | None = None) -> Parsed:
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


@ToolParser.register("gpt-oss")
class GptOssToolParser(ToolParser):
    """gpt-oss's harmony format: a call is a message to ``functions.NAME`` ending in ``<|call|>``::

        <|channel|>analysis<|message|>…reasoning…<|end|><|start|>assistant<|channel|>commentary to=functions.NAME
        <|constrain|>json<|message|>{"city": "Paris"}<|call|>

    (the recipient may also stand before the channel: ``<|start|>assistant to=functions.NAME<|channel|>…``). The
    content is the text of the ``final`` (or channel-less) messages; reasoning (``analysis``) is dropped. The model
    ends its turn with ``<|call|>`` after a call, so that token stops generation. Tool answers are written as harmony
    messages from ``functions.NAME`` (:meth:`tool_response_text`): the chat template renders a tool message only
    after the assistant message that called it.
    """

    _recipient = re.compile(r"to=(\S+?)(?=\s|<\||$)")
    _channel = re.compile(r"<\|channel\|>\s*([^\s<]+)")
    _ends = ("<|end|>", "<|call|>", "<|return|>")

    @property
    def stop_token_ids(self) -> list[int]:
        return self.token_ids("<|call|>")

    def parse_text(self, text: str, tools: list[Any] | None = None) -> Parsed:
        if "<|message|>" not in text:
            return text, [], []
        content: list[str] = []
        calls: list[FunctionCall] = []
        rejected: list[str] = []
        for chunk in text.split("<|start|>"):
            header, marker, rest = chunk.partition("<|message|>")
            if not marker:
                continue
            cut = min((i for i in (rest.find(end) for end in self._ends) if i >= 0), default=len(rest))
            body, called = rest[:cut], rest.startswith("<|call|>", cut)
            recipient = self._recipient.search(header)
            channel = self._channel.search(header)
            if recipient and recipient.group(1).startswith("functions."):
                name = recipient.group(1)[len("functions.") :]
                if not called:
                    rejected.append(f"call of {name!r} without <|call|> (cut off?): {body[:200]!r}")
                    continue
                calls.append(FunctionCall(name=name, arguments=json_arguments(body)))
            elif channel is None or channel.group(1) == "final":
                content.append(body)
        return "".join(content), calls, rejected

    def tool_response_text(self, messages: list[dict[str, Any]], calls: list[FunctionCall]) -> str | None:
        from verl.experimental.agent_loop.utils import build_gpt_oss_tool_response_text

        return build_gpt_oss_tool_response_text(messages, [call.name for call in calls])


_MODEL_PARSERS = {
    "DeepSeekV4ToolParser",
    "GLMToolParser",
    "Gemma4ToolParser",
    "KimiToolParser",
    "MiniMaxToolParser",
    "Qwen3XMLToolParser",
    "SeedToolParser",
}


def _load_builtin_parsers() -> None:
    import verl.experimental.agent_loop.model_tool_parsers  # noqa: F401 - registers the other formats


def __getattr__(name: str) -> Any:
    """The other formats' parsers, importable from here as in veRL."""
    if name in _MODEL_PARSERS:
        from verl.experimental.agent_loop import model_tool_parsers

        return getattr(model_tool_parsers, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
