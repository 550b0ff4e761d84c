"""The tool-call parsers of every ``multi_turn.format``, on responses as each model family writes them.

Each response is written the way the family's chat template renders an assistant turn with tool calls, tokenized
with a real tokenizer (the tool demo's byte-level BPE, given the family's delimiters as single tokens the way the
family's tokenizer has them) and parsed from the token ids, as the tool agent loop does. The expected calls are
written out by hand from the text.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from tokenizers import AddedToken

from verl.experimental.agent_loop.model_tool_parsers import convert_argument, gemma4_arguments
from verl.experimental.agent_loop.tool_parser import (
    DeepSeekV4ToolParser,
    FunctionCall,
    Gemma4ToolParser,
    GLMToolParser,
    GptOssToolParser,
    KimiToolParser,
    MiniMaxToolParser,
    Qwen3XMLToolParser,
    SeedToolParser,
    ToolParser,
)
from verl.tools.schemas import OpenAIFunctionToolSchema
from verl.utils.demo_tools import ensure_tool_demo_assets
from verl.utils.tokenizer import hf_tokenizer

WEATHER = OpenAIFunctionToolSchema.model_validate(
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather of a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "days": {"type": "integer"},
                    "metric": {"type": "boolean"},
                    "tags": {"type": "array", "items": {"type": "string"}},
                    "options": {"type": "object"},
                    "zip": {"type": "string"},
                    "level": {"type": ["integer", "string"]},
                },
                "required": ["city"],
            },
        },
    }
)
TOOLS = [WEATHER]

SPECIAL = {  # the delimiters each family's tokenizer has as (special) tokens
    "gpt-oss": ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|call|>", "<|return|>"],
    "qwen3_coder": [],
    "glm": ["<|observation|>", "<think>", "</think>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"],
    "seed": ["<seed:tool_call>", "</seed:tool_call>", "<seed:think>", "</seed:think>"],
    "minimax": ["<minimax:tool_call>", "</minimax:tool_call>", "<think>", "</think>"],
    "kimi": [
        "<|tool_calls_section_begin|>",
        "<|tool_calls_section_end|>",
        "<|tool_call_begin|>",
        "<|tool_call_argument_begin|>",
        "<|tool_call_end|>",
    ],
    "deepseek_v4": ["<｜end▁of▁sentence｜>", "</think>"],
    "gemma4": ["<|tool_call>", "<tool_call|>", '<|"|>'],
}


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> str:
    # the same cache as test_tool_agent_loop.py: a session builds the tool demo once
    return ensure_tool_demo_assets(tmp_path_factory.getbasetemp() / "verl_cache").model_path


def family_tokenizer(model_path: str, fmt: str):
    tokenizer = hf_tokenizer(model_path)
    tokens = [AddedToken(t, special=True, normalized=False) for t in SPECIAL[fmt]]
    tokenizer.add_tokens(tokens, special_tokens=True)
    return tokenizer


def parse(model_path: str, fmt: str, response: str, tools=TOOLS):
    """Tokenize ``response`` (+ EOS) with the family's tokenizer and parse the ids with the ``fmt`` parser."""
    tokenizer = family_tokenizer(model_path, fmt)
    ids = tokenizer.encode(response, add_special_tokens=False) + [tokenizer.eos_token_id]
    for token in SPECIAL[fmt]:  # each delimiter is one token, as in the family's tokenizer
        if token in response:
            assert tokenizer.convert_tokens_to_ids(token) in ids, token
    parser = ToolParser.get_tool_parser(fmt, tokenizer)
    content, calls = asyncio.run(parser.extract_tool_calls(ids, tools))
    _, again, rejected = asyncio.run(parser.parse(ids, tools))
    assert again == calls
    return content, [(c.name, arguments(c), c.tool_call_id) for c in calls], rejected, parser


def arguments(call: FunctionCall):
    try:
        return json.loads(call.arguments)
    except ValueError:
        return call.arguments  # passed on as written: the loop tells the model they are not a JSON object


def test_every_veRL_format_is_registered():
    assert ToolParser.names() == [
        "deepseek_v4",
        "gemma4",
        "glm",
        "gpt-oss",
        "hermes",
        "kimi",
        "minimax",
        "qwen3_coder",
        "seed",
    ]
    classes = [Qwen3XMLToolParser, GLMToolParser, SeedToolParser, MiniMaxToolParser, KimiToolParser]
    classes += [DeepSeekV4ToolParser, Gemma4ToolParser, GptOssToolParser]
    assert all(issubclass(cls, ToolParser) for cls in classes)


def test_qwen3_coder_xml_types_values_with_the_tools_schema(model_path):
    response = (
        "I'll check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSão Paulo\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n<parameter=metric>\nTrue\n</parameter>\n"
        '<parameter=tags>\n["rain", "wind"]\n</parameter>\n<parameter=zip>\n01234\n</parameter>\n'
        "<parameter=level>\nhigh\n</parameter>\n</function>\n</tool_call>\n"
        "<tool_call>\n<function=get_time>\n<parameter=zone>\nUTC\n</parameter>\n<parameter=offset>\n-2\n</parameter>\n"
        "</function>\n</tool_call>"
    )
    content, calls, rejected, parser = parse(model_path, "qwen3_coder", response)
    assert content == "I'll check.\n" and rejected == [] and parser.stop_token_ids == []
    assert calls == [
        (
            "get_weather",
            {"city": "São Paulo", "days": 3, "metric": True, "tags": ["rain", "wind"], "zip": "01234", "level": "high"},
            None,
        ),
        ("get_time", {"zone": "UTC", "offset": -2}, None),  # no schema: JSON when it reads as JSON
    ]
    # a call cut off by the length limit counts up to where it ends; a block without a function is rejected
    _, calls, rejected, _ = parse(model_path, "qwen3_coder", "<tool_call>\n<function=get_time>\n<parameter=zone>\nUT")
    assert calls == [("get_time", {"zone": "UT"}, None)] and rejected == []
    _, calls, rejected, _ = parse(model_path, "qwen3_coder", '<tool_call>\n{"name": "x"}\n</tool_call>')
    assert calls == [] and rejected == ['invalid tool call \'{"name": "x"}\': no <function=NAME>']


def test_glm_arg_pairs_and_the_observation_stop_token(model_path):
    response = (
        "<think>The user wants the weather.</think>Let me look.<tool_call>get_weather\n"
        "<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n"
        '<arg_key>options</arg_key>\n<arg_value>{"hourly": true}</arg_value>\n</tool_call>'
        "<tool_call>get_time</tool_call><tool_call>{not a name}</tool_call><|observation|>"
    )
    content, calls, rejected, parser = parse(model_path, "glm", response)
    assert content == "Let me look."
    assert calls == [
        ("get_weather", {"city": "Paris", "days": 3, "options": {"hourly": True}}, None),
        ("get_time", {}, None),
    ]
    assert rejected == ["invalid tool call '{not a name}': bad function name '{not a name}'"]
    assert parser.stop_token_ids == [parser.tokenizer.convert_tokens_to_ids("<|observation|>")]


def test_seed_and_minimax_xml(model_path):
    response = (
        "<seed:think>need the weather</seed:think>Calling.<seed:tool_call>\n<function=get_weather>\n"
        "<parameter=city>Paris</parameter>\n<parameter=days>3</parameter>\n</function>\n</seed:tool_call>"
    )
    content, calls, rejected, _ = parse(model_path, "seed", response)
    assert content == "<seed:think>need the weather</seed:think>Calling." and rejected == []
    assert calls == [("get_weather", {"city": "Paris", "days": 3}, None)]
    response = (
        '<think>\nweather and time\n</think>\n\n<minimax:tool_call>\n<invoke name="get_weather">\n'
        '<parameter name="city">Paris</parameter>\n<parameter name="metric">false</parameter>\n</invoke>\n'
        '<invoke name="get_time">\n<parameter name="zone">UTC</parameter>\n</invoke>\n</minimax:tool_call>'
    )
    content, calls, rejected, _ = parse(model_path, "minimax", response)
    assert content == "<think>\nweather and time\n</think>\n\n" and rejected == []
    assert calls == [("get_weather", {"city": "Paris", "metric": False}, None), ("get_time", {"zone": "UTC"}, None)]


def test_kimi_keeps_the_emitted_ids_and_reads_the_tool_name_from_them(model_path):
    response = (
        "Let me check.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
        '<|tool_call_argument_begin|>{"city": "Paris", "days": 3}<|tool_call_end|>'
        '<|tool_call_begin|>functions.get_time:1<|tool_call_argument_begin|>{"zone": "UTC"}<|tool_call_end|>'
        "<|tool_call_begin|>functions.get_weather:2<|tool_call_argument_begin|>not json<|tool_call_end|>"
        "<|tool_calls_section_end|>"
    )
    content, calls, rejected, parser = parse(model_path, "kimi", response)
    assert content == "Let me check." and rejected == []
    assert calls == [
        ("get_weather", {"city": "Paris", "days": 3}, "functions.get_weather:0"),
        ("get_time", {"zone": "UTC"}, "functions.get_time:1"),
        ("get_weather", "not json", "functions.get_weather:2"),
    ]
    assert parser.stop_token_ids == [parser.tokenizer.convert_tokens_to_ids("<|im_end|>")]
    # an id of another shape: the one tool whose name it contains
    assert KimiToolParser.tool_name("call-get_weather-0", TOOLS) == "get_weather"
    assert KimiToolParser.tool_name("call-get_weather-0", None) == "call-get_weather-0"


def test_deepseek_v4_dsml(model_path):
    response = (
        "The user asks for the weather.</think>Checking now.\n\n<｜DSML｜tool_calls>\n"
        '<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n'
        '<｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>\n'
        '<｜DSML｜parameter name="zip" string="true">01234</｜DSML｜parameter>\n</｜DSML｜invoke>\n'
        "</｜DSML｜tool_calls><｜end▁of▁sentence｜>"
    )
    content, calls, rejected, parser = parse(model_path, "deepseek_v4", response)
    assert content == "Checking now." and rejected == [] and parser.stop_token_ids == []
    assert calls == [("get_weather", {"city": "Paris", "days": 3, "zip": "01234"}, None)]
    content, calls, _, _ = parse(model_path, "deepseek_v4", "Reasoning.</think>It is sunny.<｜end▁of▁sentence｜>")
    assert (content, calls) == ("It is sunny.", [])


def test_gemma4_calls_and_their_argument_syntax(model_path):
    response = (
        'Sure.<|tool_call>call:get_weather{city:<|"|>Paris, "the" city<|"|>,days:3,metric:true,'
        'tags:[<|"|>rain<|"|>,<|"|>wind<|"|>],options:{hourly:false,unit:<|"|>C<|"|>},level:-1.5e2}<tool_call|>'
        '<|tool_call>call:get_time{}<tool_call|><|tool_call>call:get_time{zone:<|"|>UTC}<tool_call|>'
    )
    content, calls, rejected, parser = parse(model_path, "gemma4", response)
    assert content == "Sure."
    assert calls == [
        (
            "get_weather",
            {
                "city": 'Paris, "the" city',
                "days": 3,
                "metric": True,
                "tags": ["rain", "wind"],
                "options": {"hourly": False, "unit": "C"},
                "level": -150.0,
            },
            None,
        ),
        ("get_time", {}, None),
    ]
    assert len(rejected) == 1 and "unterminated" in rejected[0]
    assert parser.stop_token_ids == [parser.tokenizer.convert_tokens_to_ids("<tool_call|>")]
    assert gemma4_arguments('a:null,b:<|"|>x<|"|>') == {"a": None, "b": "x"}
    with pytest.raises(ValueError):
        gemma4_arguments("a:1;b:2")


def test_gpt_oss_harmony_messages(model_path):
    response = (
        "<|channel|>analysis<|message|>Call get_weather for Paris.<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
        '{"city": "Paris", "days": 3}<|call|>'
    )
    content, calls, rejected, parser = parse(model_path, "gpt-oss", response)
    assert (content, calls, rejected) == ("", [("get_weather", {"city": "Paris", "days": 3}, None)], [])
    assert parser.stop_token_ids == [parser.tokenizer.convert_tokens_to_ids("<|call|>")]
    # the recipient may stand before the channel; the final channel is the content
    response = (
        '<|start|>assistant to=functions.get_time<|channel|>commentary json<|message|>{"zone": "UTC"}<|call|>'
        "<|start|>assistant<|channel|>final<|message|>It is noon.<|return|>"
    )
    content, calls, _, _ = parse(model_path, "gpt-oss", response)
    assert (content, calls) == ("It is noon.", [("get_time", {"zone": "UTC"}, None)])
    text = parser.tool_response_text([{"role": "tool", "content": "sunny"}], [FunctionCall(name="w", arguments="{}")])
    assert text == "<|start|>functions.w to=assistant<|channel|>commentary<|message|>sunny<|end|><|start|>assistant"


def test_arguments_written_as_text_are_typed_by_their_schema():
    cases = [
        ("01234", {"type": "string"}, "01234"),
        ("3", {"type": "string"}, "3"),
        ('"quoted"', {"type": "string"}, '"quoted"'),
        ("null", {"type": "string"}, "null"),
        ("3", {"type": "integer"}, 3),
        ("2.5", {"type": "number"}, 2.5),
        ("True", {"type": "boolean"}, True),
        ("null", {"type": ["integer", "null"]}, None),
        ("[1, 2]", {"type": "array"}, [1, 2]),
        ("{'a': 1}", {"type": "object"}, {"a": 1}),  # a Python literal, read without evaluating code
        ("__import__('os').system('true')", {"type": "array"}, "__import__('os').system('true')"),
        ("high", {"type": ["integer", "string"]}, "high"),
        ("7", {"type": ["integer", "string"]}, 7),
        ("[7]", {"type": ["integer", "string"]}, "[7]"),
        ('"7"', {"type": ["integer", "string"]}, '"7"'),
        ("red", {"enum": ["red", "blue"]}, "red"),
        ("12", None, 12),
        ("twelve", None, "twelve"),
    ]
    for text, schema, expected in cases:
        assert convert_argument(text, schema) == expected, (text, schema)


def test_parsers_written_to_veRLs_older_interfaces_still_run():
    class OneArgument(ToolParser):  # veRL before 0.10: extract_tool_calls(responses_ids)
        async def extract_tool_calls(self, responses_ids):
            return "text", [FunctionCall(name="x", arguments="{}")]

    class WithTools(ToolParser):
        async def extract_tool_calls(self, responses_ids, tools=None):
            return f"{len(tools)} tools", []

    assert asyncio.run(OneArgument(None).parse([1], TOOLS)) == ("text", [FunctionCall(name="x", arguments="{}")], [])
    assert asyncio.run(WithTools(None).parse([1], TOOLS)) == ("1 tools", [], [])
    with pytest.raises(TypeError, match="implements parse_text"):

        class Nothing(ToolParser):
            pass


def test_qwen3_xml_function_call_is_typed_by_schema_and_never_evaluated(tmp_path):
    from verl.experimental.agent_loop.model_tool_parsers import Qwen3XMLToolParser

    parser = Qwen3XMLToolParser(tokenizer=None)
    tool = {"type": "function", "function": {"name": "f", "parameters": {"properties": {"n": {"type": "array"}}}}}
    call = parser._parse_xml_function_call("f><parameter=n>[1, 2]</parameter><parameter=cut", [tool])
    assert (call.name, json.loads(call.arguments)) == ("f", {"n": [1, 2]})  # the cut parameter is skipped
    code = f'__import__("os").system("touch {tmp_path / "x"}")'
    assert json.loads(parser._parse_xml_function_call(f"f><parameter=n>{code}</parameter>", [tool]).arguments) == {
        "n": code
    }
    assert not (tmp_path / "x").exists()
    assert parser._parse_xml_function_call("f", None) is None  # no ``NAME>`` header
