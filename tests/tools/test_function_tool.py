"""Function tools (``@function_tool``), the registry that merges them with the YAML tools, and the schema relaxations.

The schemas are inferred by transformers' ``get_json_schema`` from real functions here; the expected schemas are
written out by hand from the functions' signatures and docstrings.
"""

from __future__ import annotations

import asyncio
import logging
import textwrap
from typing import Any, Literal

import pytest

from verl.tools import function_tool as function_tool_module
from verl.tools.function_tool import (
    FUNCTION_TOOL_REGISTRY,
    FunctionTool,
    function_tool,
    get_function_tool,
    load_function_tools_from_path,
    normalize_function_tool_return,
)
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse


@pytest.fixture(autouse=True)
def clean_registry():
    saved = dict(FUNCTION_TOOL_REGISTRY), dict(function_tool_module._LOADED_FUNCTION_TOOL_PATHS)
    FUNCTION_TOOL_REGISTRY.clear()
    function_tool_module._LOADED_FUNCTION_TOOL_PATHS.clear()
    yield
    FUNCTION_TOOL_REGISTRY.clear()
    function_tool_module._LOADED_FUNCTION_TOOL_PATHS.clear()
    FUNCTION_TOOL_REGISTRY.update(saved[0])
    function_tool_module._LOADED_FUNCTION_TOOL_PATHS.update(saved[1])


def schema_of(name: str) -> dict[str, Any]:
    return FUNCTION_TOOL_REGISTRY[name].tool_schema.model_dump(exclude_unset=True, exclude_none=True)


def test_the_schema_is_inferred_from_the_signature_and_the_docstring():
    @function_tool
    def book_flight(city: str, seats: int, cabin: Literal["economy", "business"] = "economy", flexible: bool = False):
        """Book a flight to a city.

        Args:
            city: where to fly.
            seats: how many seats.
            cabin: the cabin class.
            flexible: whether the dates may move.

        Returns:
            the booking reference.
        """

    assert schema_of("book_flight") == {
        "type": "function",
        "function": {
            "name": "book_flight",
            "description": "Book a flight to a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "where to fly."},
                    "seats": {"type": "integer", "description": "how many seats."},
                    "cabin": {"type": "string", "enum": ["economy", "business"], "description": "the cabin class."},
                    "flexible": {"type": "boolean", "description": "whether the dates may move."},
                },
                "required": ["city", "seats"],  # the parameters without a default
            },
        },
    }
    assert "return" not in schema_of("book_flight")["function"]


def test_relaxed_schemas_list_types_json_enums_untyped_and_omitted_required():
    @function_tool("scale")
    def anything(x: int | float, level: Literal[1, 2, 3], extra: Any = None) -> str:
        """Scale a number.

        Args:
            x: the number.
            level: how much.
            extra: anything at all.
        """
        return str(x * level)

    properties = schema_of("scale")["function"]["parameters"]["properties"]
    assert properties["x"]["type"] == ["integer", "number"]
    assert properties["level"]["enum"] == [1, 2, 3]
    assert "type" not in properties["extra"]
    no_required = {"type": "function", "function": {"name": "f", "description": "d", "parameters": {}}}
    no_required["function"]["parameters"] = {"type": "object", "properties": {"a": {"type": "string"}}}
    assert OpenAIFunctionToolSchema.model_validate(no_required).function.parameters.required == []


def test_naming_an_explicit_schema_and_the_returned_function():
    @function_tool("lookup")
    def find(key: str) -> str:
        """Find a key.

        Args:
            key: the key.
        """
        return key

    assert find("k") == "k"  # the decorator returns the function itself
    assert get_function_tool("lookup").fn is find and schema_of("lookup")["function"]["name"] == "lookup"
    schema = {
        "type": "function",
        "function": {"name": "ping", "description": "given", "parameters": {"type": "object", "properties": {}}},
    }

    @function_tool(schema=schema)
    def undocumented():
        return "pong"

    assert get_function_tool("ping").fn is undocumented and schema_of("ping")["function"]["description"] == "given"
    with pytest.raises(ValueError, match="the given schema names the function 'ping'"):
        function_tool("other", schema=schema)(undocumented)
    with pytest.raises(KeyError, match="no function tool 'nope'.*registered: \\['lookup', 'ping'\\]"):
        get_function_tool("nope")


def test_functions_that_cannot_describe_themselves_are_refused_naming_the_function():
    def no_docstring(x: str) -> str:
        return x

    def untyped(x):
        """Doc.

        Args:
            x: a thing.
        """

    def undescribed(x: int, y: int) -> int:
        """Add.

        Args:
            x: only x.
        """
        return x + y

    def variadic(x: int, *rest: int) -> int:
        """Sum.

        Args:
            x: x.
        """
        return x

    cases = {
        no_docstring: "no docstring",
        untyped: "missing a type hint",
        undescribed: "no description for the argument 'y'",
        variadic: r"variadic parameter\(s\) \['rest'\]",
    }
    for fn, reason in cases.items():
        with pytest.raises(ValueError, match=reason) as error:
            function_tool(fn)
        assert f"@function_tool '{fn.__name__}'" in str(error.value) and "test_function_tool.py" in str(error.value)
    assert FUNCTION_TOOL_REGISTRY == {}


def test_two_functions_cannot_share_a_name():
    def first(x: str) -> str:
        """One.

        Args:
            x: x.
        """
        return x

    def second(x: str) -> str:
        """Two.

        Args:
            x: x.
        """
        return x

    function_tool("same")(first)
    function_tool("same")(first)  # the same function again is fine
    with pytest.raises(ValueError, match="'same': the name is already registered by .*first.*second"):
        function_tool("same")(second)


def test_sync_and_async_functions_are_called_with_the_models_arguments():
    @function_tool
    def shout(text: str) -> str:
        """Shout.

        Args:
            text: the text.
        """
        return text.upper()

    @function_tool
    async def whisper(text: str) -> str:
        """Whisper.

        Args:
            text: the text.
        """
        await asyncio.sleep(0)
        return text.lower()

    shout_tool, whisper_tool = get_function_tool("shout"), get_function_tool("whisper")
    assert (shout_tool.is_async, whisper_tool.is_async) == (False, True)
    assert asyncio.run(shout_tool.call({"text": "hi"})) == "HI"
    assert asyncio.run(whisper_tool.call({"text": "HI"})) == "hi"
    with pytest.raises(TypeError):
        asyncio.run(shout_tool.call({"words": "hi"}))


def test_every_return_form_becomes_response_reward_and_metrics():
    class Thing:
        def __str__(self) -> str:
            return "a thing"

    given = ToolResponse(text="as is")
    cases = [
        (given, (given, 0.0, {})),
        ("text", (ToolResponse(text="text"), 0.0, {})),
        ({"a": 1, "b": "é"}, (ToolResponse(text='{"a": 1, "b": "é"}'), 0.0, {})),
        (("text",), (ToolResponse(text="text"), 0.0, {})),
        (("text", 2), (ToolResponse(text="text"), 2.0, {})),
        (("text", None, None), (ToolResponse(text="text"), 0.0, {})),
        (({"k": 1}, 0.5, {"hits": 3}), (ToolResponse(text='{"k": 1}'), 0.5, {"hits": 3})),
        (Thing(), (ToolResponse(text="a thing"), 0.0, {})),
    ]
    for value, expected in cases:
        assert normalize_function_tool_return(value) == expected
    assert normalize_function_tool_return(given)[0] is given
    for bad in ((), ("a", 1.0, {}, "extra")):
        with pytest.raises(TypeError, match=f"tuple of length {len(bad)}; a tuple must have length 1, 2, or 3"):
            normalize_function_tool_return(bad)


TOOLS_FILE = '''
from verl.tools.function_tool import function_tool
from verl.tools.schemas import ToolResponse

CALLS = []


@function_tool
def get_weather(city: str, unit: str = "celsius") -> dict:
    """Get the weather of a city.

    Args:
        city: the city.
        unit: celsius or fahrenheit.
    """
    CALLS.append(city)
    return {"city": city, "temperature": 21, "unit": unit}


@function_tool("add")
async def add_numbers(a: float, b: float):
    """Add two numbers.

    Args:
        a: the first.
        b: the second.
    """
    return ToolResponse(text=str(a + b)), 1.0, {"added": True}
'''


def write(tmp_path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_a_file_of_tools_loads_once_by_path(tmp_path, monkeypatch):
    path = write(tmp_path, "weather_tools.py", TOOLS_FILE)

    @function_tool
    def elsewhere(x: str) -> str:
        """Defined outside the file.

        Args:
            x: x.
        """
        return x

    tools = load_function_tools_from_path(path)
    assert [t.name for t in tools] == ["get_weather", "add"] and all(isinstance(t, FunctionTool) for t in tools)
    assert load_function_tools_from_path(path)[0] is tools[0]  # the file runs once
    monkeypatch.chdir(tmp_path)
    assert load_function_tools_from_path("weather_tools.py")[1] is tools[1]  # relative to the working directory
    assert asyncio.run(tools[0].call({"city": "Paris"})) == {"city": "Paris", "temperature": 21, "unit": "celsius"}
    assert normalize_function_tool_return(asyncio.run(tools[1].call({"a": 1, "b": 2.5}))) == (
        ToolResponse(text="3.5"),
        1.0,
        {"added": True},
    )
    assert sorted(FUNCTION_TOOL_REGISTRY) == ["add", "elsewhere", "get_weather"]


def test_loading_errors_name_the_file(tmp_path, caplog):
    with pytest.raises(FileNotFoundError, match="function_tool_path does not exist: .*missing.py"):
        load_function_tools_from_path(str(tmp_path / "missing.py"))
    broken = write(tmp_path, "broken.py", TOOLS_FILE + "\nraise RuntimeError('no network here')\n")
    with pytest.raises(ImportError, match=r"broken.py'.*RuntimeError: no network here"):
        load_function_tools_from_path(broken)
    assert FUNCTION_TOOL_REGISTRY == {}  # a file that fails half-way leaves no tools behind
    bad_tool = write(
        tmp_path,
        "bad_tool.py",
        "from verl.tools.function_tool import function_tool\n\n@function_tool\ndef f(x): pass\n",
    )
    with pytest.raises(ImportError, match="bad_tool.py.*@function_tool 'f'.*no docstring"):
        load_function_tools_from_path(bad_tool)
    empty = write(tmp_path, "empty.py", "X = 1\n")
    with caplog.at_level(logging.WARNING):
        assert load_function_tools_from_path(empty) == []
    assert "no @function_tool decorators found" in caplog.text


YAML = """\
tools:
  - class_name: verl.tools.calculator_tool.CalculatorTool
    config: {type: native}
"""


def test_load_all_tools_merges_yaml_and_function_tools(tmp_path):
    from verl.tools.base_tool import BaseTool
    from verl.tools.tool_registry import load_all_tools
    from verl.tools.utils import tool_registry as old_path

    yaml_path, py_path = write(tmp_path, "tools.yaml", YAML), write(tmp_path, "mine.py", TOOLS_FILE)
    tools = load_all_tools(yaml_path, py_path)
    assert [t.name for t in tools] == ["calculator", "get_weather", "add"] and isinstance(tools[0], BaseTool)
    assert [t.name for t in load_all_tools(tools_config_file=yaml_path)] == ["calculator"]
    assert [t.name for t in load_all_tools(function_tool_path=py_path)] == ["get_weather", "add"]
    assert load_all_tools() == [] and old_path.load_all_tools is load_all_tools
    assert old_path.initialize_tools_from_config(yaml_path)[0].name == "calculator"  # veRL's older path still works
    with pytest.raises(ValueError, match="name two files"):
        load_all_tools(yaml_path, tools_config_file=str(tmp_path / "other.yaml"))


def test_a_function_tool_may_not_take_a_yaml_tools_name(tmp_path):
    from verl.tools.tool_registry import load_all_tools

    clash = TOOLS_FILE.replace('@function_tool("add")', '@function_tool("calculator")')
    yaml_path, py_path = write(tmp_path, "tools.yaml", YAML), write(tmp_path, "clash.py", clash)
    with pytest.raises(ValueError) as error:
        load_all_tools(yaml_path, py_path)
    message = str(error.value)
    assert message.startswith("function tool names ['calculator'] collide with tools of tool_config_path")
    assert "'calculator' is verl.tools.calculator_tool.CalculatorTool in tool_config_path" in message
    assert "add_numbers" in message and "clash.py" in message and "tools.yaml" in message
