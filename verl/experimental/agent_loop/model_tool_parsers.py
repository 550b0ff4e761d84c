"""Tool-call parsers of the model families veRL 0.10 added (``multi_turn.format``): ``qwen3_coder``, ``glm``,
``seed``, ``minimax``, ``kimi``, ``deepseek_v4`` and ``gemma4``. See :mod:`verl.experimental.agent_loop.tool_parser`
for the interface and a table of the formats.

The XML formats write each argument as text; :func:`convert_argument` types it with the tool's schema, the way the
models' chat templates write arguments: a string parameter keeps the text as written, other types are read as JSON
(or a Python literal: Qwen3-Coder's template writes ``True``), and text that reads as neither stays text. Without a
schema (an unknown tool) text that reads as JSON is taken as JSON. A block that cannot be a call (no function name,
arguments that do not parse) is rejected with its reason; the content is the text before the first call, as in veRL.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from verl.experimental.agent_loop.tool_parser import FunctionCall, Parsed, ToolParser, json_arguments

__all__ = [
    "DeepSeekV4ToolParser",
    "GLMToolParser",
    "Gemma4ToolParser",
    "KimiToolParser",
    "MiniMaxToolParser",
    "Qwen3XMLToolParser",
    "SeedToolParser",
    "convert_argument",
    "tool_properties",
]

_NOT_A_LITERAL = object()
_JSON_KINDS = ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"), (list, "array"))


def tool_properties(tools: list[Any] | None, name: str) -> dict[str, Any] | None:
    """The parameter schemas (``properties``) of the tool ``name`` among ``tools`` (OpenAI schemas, as pydantic
    models or dicts); None when the tool is not among them."""
    for tool in tools or ():
        schema = tool.model_dump(exclude_none=True) if hasattr(tool, "model_dump") else dict(tool)
        function = schema.get("function") or {}
        if function.get("name") == name:
            return dict((function.get("parameters") or {}).get("properties") or {})
    return None


def _kinds(schema: Any) -> set[str]:
    if not isinstance(schema, dict):
        return set()
    kind = schema.get("type")
    if kind is None and schema.get("enum"):
        return {"string"} if all(isinstance(v, str) for v in schema["enum"]) else set()
    return {kind} if isinstance(kind, str) else set(kind or ())


def _literal(text: str) -> Any:
    """``text`` as JSON, else as a Python literal (never evaluated as code); ``_NOT_A_LITERAL`` when neither."""
    text = text.strip()
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:
        value = ast.literal_eval(text)
        json.dumps(value)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return _NOT_A_LITERAL
    return list(value) if isinstance(value, tuple) else value


def _kind_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "object"
    return next(kind for cls, kind in _JSON_KINDS if isinstance(value, cls))


def convert_argument(text: str, schema: dict[str, Any] | None) -> Any:
    """An argument written as text, typed by its parameter ``schema`` (see the module docstring)."""
    kinds = _kinds(schema)
    if kinds == {"string"}:  # as written, even when it reads as JSON ('"quoted"', '3')
        return text
    value = _literal(text)
    if value is _NOT_A_LITERAL:
        return text
    if "string" not in kinds:
        return value
    # a string is one of the types: the text stands as written unless it reads as one of the others
    kind = _kind_of(value)
    return value if kind != "string" and (kind in kinds or (kind == "integer" and "number" in kinds)) else text


def _trim(value: str) -> str:
    """Drop the newline a template writes after an opening tag and before the closing one."""
    return value.removeprefix("\n").removesuffix("\n")


def _call(name: str, pairs: list[tuple[str, str]], tools: list[Any] | None) -> FunctionCall:
    properties = tool_properties(tools, name) or {}
    arguments = {key.strip(): convert_argument(_trim(value), properties.get(key.strip())) for key, value in pairs}
    return FunctionCall(name=name, arguments=json.dumps(arguments, ensure_ascii=False))


def _valid_name(name: str) -> bool:
    return bool(name) and not re.search(r"[\s{}<>\"]", name)


def _before(text: str, marker: str) -> str:
    index = text.find(marker)
    return text if index < 0 else text[:index]


@ToolParser.register("qwen3_coder")
class Qwen3XMLToolParser(ToolParser):
    """Qwen3-Coder (and Qwen3.5) XML calls::

        <tool_call>
        <function=get_weather>
        <parameter=city>
        Paris
        </parameter>
        </function>
        </tool_call>

    A call cut off before its closing tags (the response hit its length) still counts up to where it ends.
    """

    tool_call_start_token = "<tool_call>"
    _block = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
    _function = re.compile(r"<function=([^>\n]*)>(.*?)(?:</function>|\Z)", re.DOTALL)
    _parameter = re.compile(r"<parameter=([^>\n]*)>(.*?)(?:</parameter>|(?=<parameter=)|\Z)", re.DOTALL)

    def parse_text(self, text: str, tools: list[Any] | None = None) -> Parsed:
        if self.tool_call_start_token not in text:
            return text, [], []
        calls: list[FunctionCall] = []
        rejected: list[str] = []
        for block in self._block.findall(text):
            functions = self._function.findall(block)
            if not functions:
                rejected.append(f"invalid tool call {block.strip()[:200]!r}: no <function=NAME>")
            for name, body in functions:
                call = self._parse_xml_function_call(f"{name}>{body}", tools)
                if call is None:
                    rejected.append(f"invalid tool call {block.strip()[:200]!r}: bad function name {name!r}")
                    continue
                calls.append(call)
        return _before(text, self.tool_call_start_token), calls, rejected

    def _parse_xml_function_call(self, function_call_str: str, tools: list[Any] | None = None) -> FunctionCall | None:
        """One call from the text after ``<function=`` — ``NAME><parameter=K>V</parameter>...`` — its values typed
        by the tool's schema (never evaluated as code); None when the header has no valid ``NAME>``. A parameter cut
        off before its ``>`` is skipped, the others kept."""
        name, sep, body = function_call_str.partition(">")
        name = name.strip()
        if not sep or not _valid_name(name):
            return None
        return _call(name, self._parameter.findall(body), tools)


@ToolParser.register("glm")
class GLMToolParser(ToolParser):
    """GLM-4.5 / 4.6 / 4.7 calls (the model then emits ``<|observation|>``, which stops generation)::

        <tool_call>get_weather
        <arg_key>city</arg_key>
        <arg_value>Paris</arg_value>
        </tool_call>

    The content drops a leading ``<think>…</think>``.
    """

    tool_call_start_token = "<tool_call>"
    _block = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
    _pair = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)
    _thinking = re.compile(r"^\s*(?:<think>.*?)?</think>", re.DOTALL)

    @property
    def stop_token_ids(self) -> list[int]:
        return self.token_ids("<|observation|>")

    def parse_text(self, text: str, tools: list[Any] | None = None) -> Parsed:
        if self.tool_call_start_token not in text:
            return text, [], []
        calls: list[FunctionCall] = []
        rejected: list[str] = []
        for block in self._block.findall(text):
            name = _before(block, "<arg_key>").strip()
            if not _valid_name(name):
                rejected.append(f"invalid tool call {block.strip()[:200]!r}: bad function name {name!r}")
                continue
            calls.append(_call(name, self._pair.findall(block), tools))
        return self._thinking.sub("", _before(text, self.tool_call_start_token), count=1), calls, rejected


class _XmlBlockToolParser(ToolParser):
    """Calls as XML-ish blocks, each holding one or more functions with their parameters; a subclass gives the
    block, function and parameter patterns and the function's shape for the error."""

    _block: re.Pattern
    _function: re.Pattern
    _parameter: re.Pattern
    _function_shape: str

    def parse_text(self, text: str, tools: list[Any] | None = None) -> Parsed:
        if self.tool_call_start_token not in text:
            return text, [], []
        calls: list[FunctionCall] = []
        rejected: list[str] = []
        for block in self._block.findall(text):
            functions = self._function.findall(block)
            if not functions:
                rejected.append(f"invalid tool call {block.strip()[:200]!r}: no {self._function_shape}")
            calls += [_call(name.strip(), self._parameter.findall(body), tools) for name, body in functions]
        return _before(text, self.tool_call_start_token), calls, rejected


@ToolParser.register("seed")
class SeedToolParser(_XmlBlockToolParser):
    """ByteDance Seed-OSS calls::

    <seed:tool_call>
    <function=get_weather>
    <parameter=city>Paris</parameter>
    </function>
    </seed:tool_call>
    """

    tool_call_start_token = "<seed:tool_call>"
    _block = re.compile(r"<seed:tool_call>(.*?)</seed:tool_call>", re.DOTALL)
    _function = re.compile(r"<function=([^>\n]+)>(.*?)</function>", re.DOTALL)
    _parameter = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)

    _function_shape = "<function=NAME>...</function>"


@ToolParser.register("minimax")
class MiniMaxToolParser(_XmlBlockToolParser):
    """MiniMax-M2 calls (one block may hold several ``invoke`` s)::

    <minimax:tool_call>
    <invoke name="get_weather">
    <parameter name="city">Paris</parameter>
    </invoke>
    </minimax:tool_call>
    """

    tool_call_start_token = "<minimax:tool_call>"
    _block = re.compile(r"<minimax:tool_call>(.*?)</minimax:tool_call>", re.DOTALL)
    _function = re.compile(r'<invoke name="([^"]+)">(.*?)</invoke>', re.DOTALL)
    _parameter = re.compile(r'<parameter name="([^"]+)">(.*?)</parameter>', re.DOTALL)

    _function_shape = "<invoke name=...>...</invoke>"


@ToolParser.register("kimi")
class KimiToolParser(ToolParser):
    """Kimi K2 calls, in special tokens; the model names each call with an id, ``functions.NAME:INDEX``::

        <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>
        {"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>

    The id as emitted becomes the call's ``tool_call_id`` (Kimi's template quotes it in the tool's answer); the tool's
    name is read from it — ``NAME`` of ``functions.NAME:INDEX``, or else the one tool of ``tools`` whose name the id
    contains. ``<|im_end|>`` stops generation after the calls.
    """

    _sections = ("<|tool_calls_section_begin|>", "<|tool_call_section_begin|>")
    _call_pattern = re.compile(
        r"<\|tool_call_begin\|>\s*(.*?)\s*<\|tool_call_argument_begin\|>(.*?)<\|tool_call_end\|>", re.DOTALL
    )
    _id = re.compile(r"(?:functions\.)?(.+?)(?::\d+)?")

    @property
    def stop_token_ids(self) -> list[int]:
        return self.token_ids("<|im_end|>")

    @classmethod
    def tool_name(cls, call_id: str, tools: list[Any] | None) -> str:
        """The tool that the call id ``call_id`` names (see the class docstring)."""
        candidate = cls._id.fullmatch(call_id).group(1)
        names = [n for n in (_schema_name(t) for t in tools or ()) if n]
        if not names or candidate in names:
            return candidate
        contained = sorted((n for n in names if n in call_id), key=len, reverse=True)
        if len(contained) == 1 or (len(contained) > 1 and len(contained[0]) > len(contained[1])):
            return contained[0]
        return candidate

    def parse_text(self, text: str, tools: list[Any] | None = None) -> Parsed:
        starts = [i for i in (text.find(s) for s in self._sections) if i >= 0]
        if not starts:
            return text, [], []
        calls: list[FunctionCall] = []
        rejected: list[str] = []
        for call_id, arguments in self._call_pattern.findall(text):
            if not call_id:
                rejected.append(f"invalid tool call (no id) with arguments {arguments.strip()[:200]!r}")
                continue
            name = self.tool_name(call_id, tools)
            calls.append(FunctionCall(name=name, arguments=json_arguments(arguments), tool_call_id=call_id))
        return text[: min(starts)], calls, rejected


def _schema_name(tool: Any) -> str | None:
    function = getattr(tool, "function", None)
    if function is not None:
        return function.name
    return ((tool or {}).get("function") or {}).get("name") if isinstance(tool, dict) else None


@ToolParser.register("deepseek_v4")
class DeepSeekV4ToolParser(ToolParser):
    """DeepSeek-V4 DSML calls (``string="true"``: the value as written; ``"false"``: a JSON value)::

        <｜DSML｜tool_calls>
        <｜DSML｜invoke name="get_weather">
        <｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>
        <｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>
        </｜DSML｜invoke>
        </｜DSML｜tool_calls>

    The content is what follows the reasoning (after ``</think>``), without the blank line before the calls.
    """

    tool_calls_start_token = "<｜DSML｜tool_calls>"
    eos_token = "<｜end▁of▁sentence｜>"
    _block = re.compile(r"<｜DSML｜tool_calls>(.*?)</｜DSML｜tool_calls>", re.DOTALL)
    _invoke = re.compile(r'<｜DSML｜invoke name="([^"]*)">(.*?)</｜DSML｜invoke>', re.DOTALL)
    _parameter = re.compile(
        r'<｜DSML｜parameter name="([^"]*)" string="(true|false)">(.*?)</｜DSML｜parameter>', re.DOTALL
    )

    def parse_text(self, text: str, tools: list[Any] | None = None) -> Parsed:
        text = text.replace(self.eos_token, "")
        content = _before(text, self.tool_calls_start_token).rpartition("</think>")[2]
        if self.tool_calls_start_token not in text:
            return content, [], []
        calls: list[FunctionCall] = []
        rejected: list[str] = []
        for block in self._block.findall(text):
            invokes = self._invoke.findall(block)
            if not invokes:
                rejected.append(f"invalid tool call {block.strip()[:200]!r}: no invoke")
            for name, body in invokes:
                arguments: dict[str, Any] = {}
                for key, is_string, value in self._parameter.findall(body):
                    literal = _NOT_A_LITERAL if is_string == "true" else _literal(value)
                    arguments[key] = value if literal is _NOT_A_LITERAL else literal
                if not _valid_name(name):
                    rejected.append(f"invalid tool call {block.strip()[:200]!r}: bad function name {name!r}")
                    continue
                calls.append(FunctionCall(name=name, arguments=json.dumps(arguments, ensure_ascii=False)))
        return content.removesuffix("\n\n"), calls, rejected


_GEMMA_QUOTE = '<|"|>'
_GEMMA_TOKEN = re.compile(
    r'\s+|"(?:[^"\\]|\\.)*"|-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|[A-Za-z_][\w.\-]*|[{}\[\]:,]', re.DOTALL
)


def gemma4_arguments(body: str) -> dict[str, Any]:
    """Gemma 4's argument object — JSON with bare keys and strings between ``<|"|>`` — as a dict.

    Raises:
        ValueError: ``body`` is not such an object.
    """
    pieces, i = ["{"], 0
    while i < len(body):
        if body.startswith(_GEMMA_QUOTE, i):
            end = body.find(_GEMMA_QUOTE, i + len(_GEMMA_QUOTE))
            if end < 0:
                raise ValueError(f"unterminated {_GEMMA_QUOTE} string at {body[i : i + 40]!r}")
            pieces.append(json.dumps(body[i + len(_GEMMA_QUOTE) : end], ensure_ascii=False))
            i = end + len(_GEMMA_QUOTE)
            continue
        match = _GEMMA_TOKEN.match(body, i)
        if match is None:
            raise ValueError(f"unexpected text at {body[i : i + 40]!r}")
        token = match.group()
        word = token[0].isalpha() or token[0] == "_"
        if word and token not in ("true", "false", "null"):
            token = json.dumps(token)  # a bare key (or a bare word as a value)
        pieces.append(token)
        i = match.end()
    value = json.loads("".join(pieces) + "}")
    if not isinstance(value, dict):
        raise ValueError("the arguments are not an object")
    return value


@ToolParser.register("gemma4")
class Gemma4ToolParser(ToolParser):
    """Gemma 4 calls, between special tokens, with Gemma's argument syntax (see :func:`gemma4_arguments`)::

        <|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:3}<tool_call|>

    Gemma does not emit EOS after ``<tool_call|>``, so that token stops generation.
    """

    tool_call_start_token = "<|tool_call>"
    tool_call_end_token = "<tool_call|>"
    _call_pattern = re.compile(r"<\|tool_call>call:([^{\s]*)\{(.*?)\}<tool_call\|>", re.DOTALL)

    @property
    def stop_token_ids(self) -> list[int]:
        return self.token_ids(self.tool_call_end_token)

    def parse_text(self, text: str, tools: list[Any] | None = None) -> Parsed:
        if self.tool_call_start_token not in text:
            return text, [], []
        calls: list[FunctionCall] = []
        rejected: list[str] = []
        for name, body in self._call_pattern.findall(text):
            try:
                if not _valid_name(name):
                    raise ValueError(f"bad function name {name!r}")
                arguments = gemma4_arguments(body)
            except ValueError as e:
                rejected.append(f"invalid tool call {name}{{{body[:200]}}}: {e}")
                continue
            calls.append(FunctionCall(name=name, arguments=json.dumps(arguments, ensure_ascii=False)))
        unterminated = text.count(self.tool_call_start_token) - len(calls) - len(rejected)
        if unterminated > 0:
            rejected += [f"tool call without {self.tool_call_end_token} (cut off?)"] * unterminated
        return _before(text, self.tool_call_start_token), calls, rejected
