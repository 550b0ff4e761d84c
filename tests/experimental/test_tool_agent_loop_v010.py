"""veRL 0.10's tool API in the tool agent loop: function tools loaded by path, per-sample ``tool_selection``, tool-call
ids carried into the messages and the chat template, the parsers' stop tokens and tool turns, and the batch's stable
``extra_fields`` columns.

As in ``test_tool_agent_loop.py``, the loop runs in-process with the tool demo's real tokenizer (given a model
family's delimiters where a format needs them) and real tools; only the model is scripted.
"""

from __future__ import annotations

import asyncio
import json
import textwrap

import numpy as np
import pytest
from omegaconf import OmegaConf
from tokenizers import AddedToken

from tests.experimental.test_tool_agent_loop import MULTI_TURN_DEFAULTS, QUESTION, ScriptedModel, call, segments
from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, DictConfigWrap, ToolListWrap
from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop
from verl.tools import function_tool as function_tool_module
from verl.tools.function_tool import FUNCTION_TOOL_REGISTRY, load_function_tools_from_path
from verl.utils.demo_tools import ensure_tool_demo_assets
from verl.utils.tokenizer import hf_tokenizer

FUNCTION_TOOLS = '''
from verl.tools.function_tool import function_tool


@function_tool
def get_weather(city: str, unit: str = "celsius") -> dict:
    """Get the weather of a city.

    Args:
        city: the city.
        unit: celsius or fahrenheit.
    """
    return {"city": city, "temperature": 21, "unit": unit}


@function_tool
async def score(answer: str):
    """Score an answer.

    Args:
        answer: the answer.
    """
    return f"scored {answer}", 0.25, {"scored": True}
'''
CALCULATOR_YAML = "tools:\n  - class_name: verl.tools.calculator_tool.CalculatorTool\n    config: {type: native}\n"


@pytest.fixture(autouse=True)
def clean_registry():
    FUNCTION_TOOL_REGISTRY.clear()
    function_tool_module._LOADED_FUNCTION_TOOL_PATHS.clear()
    yield
    FUNCTION_TOOL_REGISTRY.clear()
    function_tool_module._LOADED_FUNCTION_TOOL_PATHS.clear()


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> str:
    # the same cache as test_tool_agent_loop.py: a session builds the tool demo once
    return ensure_tool_demo_assets(tmp_path_factory.getbasetemp() / "verl_cache").model_path


@pytest.fixture(scope="module")
def tokenizer(model_path):
    return hf_tokenizer(model_path)


@pytest.fixture
def tool_files(tmp_path) -> dict[str, str]:
    (tmp_path / "my_function_tools.py").write_text(textwrap.dedent(FUNCTION_TOOLS))
    (tmp_path / "tools.yaml").write_text(CALCULATOR_YAML)
    return {
        "tool_config_path": str(tmp_path / "tools.yaml"),
        "function_tool_path": str(tmp_path / "my_function_tools.py"),
    }


def run(tokenizer, turns, *, loop_cls=ToolAgentLoop, fields=None, sampling=None, loop_kwargs=None, **multi_turn):
    config = OmegaConf.create(
        {
            "actor_rollout_ref": {
                "rollout": {
                    "prompt_length": 128,
                    "response_length": 384,
                    "multi_turn": {**MULTI_TURN_DEFAULTS, **multi_turn},
                }
            },
            "data": {},
        }
    )
    model = ScriptedModel(tokenizer, turns)

    async def go():
        loop = loop_cls(
            trainer_config=DictConfigWrap(config), server_manager=model, tokenizer=tokenizer, **(loop_kwargs or {})
        )
        return await loop.run(sampling or {"temperature": 1.0}, raw_prompt=QUESTION, **(fields or {}))

    return asyncio.run(go()), model


class RecordingLoop(ToolAgentLoop):
    """Keeps the conversation's messages after each tool turn."""

    messages: list[list[dict]] = []

    async def _handle_processing_tools_state(self, agent_data, sampling_params):
        state = await super()._handle_processing_tools_state(agent_data, sampling_params)
        RecordingLoop.messages.append([dict(m) for m in agent_data.messages])
        return state


def with_tokens(model_path: str, tokens: list[str], chat_template: str | None = None):
    tokenizer = hf_tokenizer(model_path)
    tokenizer.add_tokens([AddedToken(t, special=True, normalized=False) for t in tokens], special_tokens=True)
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    return tokenizer


def test_function_tools_from_a_file_run_beside_the_yaml_tools(tokenizer, tool_files):
    turn = call("get_weather", city="Paris") + call("calculator", expression="3 + 4") + call("score", answer="7")
    fields = {"tools_kwargs": {"get_weather": {"create_kwargs": {"ignored": True}}}}  # function tools get none
    output, model = run(tokenizer, [turn, "done"], fields=fields, max_parallel_calls=3, **tool_files)
    prompt = tokenizer.decode(model.calls[0]["prompt_ids"])
    assert prompt.startswith(
        "<|im_start|>system\nTools: calculator(expression), get_weather(city, unit), score(answer)"
    )
    tool_turn = segments(tokenizer, output)[1][1]
    assert '<tool_response>\n{"city": "Paris", "temperature": 21, "unit": "celsius"}\n</tool_response>' in tool_turn
    assert (
        "<tool_response>\n7\n</tool_response>" in tool_turn
        and "<tool_response>\nscored 7\n</tool_response>" in tool_turn
    )
    assert output.extra_fields["tool_rewards"] == [0.0, 0.0, 0.25]
    metrics = output.metrics.model_dump()
    assert (metrics["num_tool_calls"], metrics["tool_errors"]) == (3, 0)
    # a function tool called with arguments it does not take answers the model with the error
    output, _ = run(tokenizer, [call("get_weather", town="Paris"), "ok"], **tool_files)
    assert "Error executing tool 'get_weather': " in segments(tokenizer, output)[1][1]
    assert output.metrics.model_dump()["tool_errors"] == 1


def test_a_function_tool_named_like_a_yaml_tool_stops_the_loop_from_building(tokenizer, tool_files, tmp_path):
    clash = tmp_path / "clash.py"
    clash.write_text(textwrap.dedent(FUNCTION_TOOLS).replace("def score(", "def calculator("))
    with pytest.raises(ValueError, match="'calculator' is verl.tools.calculator_tool.CalculatorTool"):
        run(tokenizer, ["x"], tool_config_path=tool_files["tool_config_path"], function_tool_path=str(clash))


def test_tool_selection_shows_and_runs_only_the_samples_tools(tokenizer, tool_files):
    for selection in (["get_weather"], np.array(["get_weather"], dtype=object)):  # a parquet list column: an array
        fields = {"extra_info": {"tool_selection": selection}}
        output, model = run(tokenizer, [call("calculator", expression="1 + 1"), "ok"], fields=fields, **tool_files)
        assert tokenizer.decode(model.calls[0]["prompt_ids"]).startswith(
            "<|im_start|>system\nTools: get_weather(city, unit)<|im_end|>"
        )
        assert "Unknown function 'calculator'. Available tools: ['get_weather']" in segments(tokenizer, output)[1][1]
    output, model = run(tokenizer, ["ok"], fields={"extra_info": {"tool_selection": []}}, **tool_files)
    assert "Tools: calculator(expression), get_weather" in tokenizer.decode(model.calls[0]["prompt_ids"])
    with pytest.raises(ValueError, match=r"tool_selection=\['score', 'nope'\] names tools that are not configured"):
        run(tokenizer, ["ok"], fields={"extra_info": {"tool_selection": ["score", "nope"]}}, **tool_files)


def test_tools_handed_to_the_constructor_replace_the_configs(tokenizer, tool_files):
    tools = load_function_tools_from_path(tool_files["function_tool_path"])[:1]
    output, model = run(tokenizer, [call("get_weather", city="Oslo"), "ok"], loop_kwargs={"tools": ToolListWrap(tools)})
    assert tokenizer.decode(model.calls[0]["prompt_ids"]).startswith("<|im_start|>system\nTools: get_weather(city, u")
    assert '"city": "Oslo"' in segments(tokenizer, output)[1][1]


# Kimi K2's layout: a tool message is rendered with the id of the call it answers
KIMI_TEMPLATE = (
    "{%- for message in messages %}{%- if message.role == 'tool' %}"
    "{{ '<|im_system|>tool<|im_middle|>## Return of ' + message.tool_call_id + '\\n' }}"
    "{{ message.content + '<|im_end|>' }}"
    "{%- elif message.role %}{{ '<|im_user|>' + message.role + '<|im_middle|>' + message.content + '<|im_end|>' }}"
    "{%- endif %}{%- endfor %}{%- if add_generation_prompt %}{{ '<|im_assistant|>assistant<|im_middle|>' }}{%- endif %}"
)
KIMI_TOKENS = [
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
    "<|im_system|>",
    "<|im_user|>",
    "<|im_assistant|>",
    "<|im_middle|>",
]


def test_kimi_call_ids_reach_the_assistant_and_tool_messages_and_the_template(model_path, tool_files):
    tokenizer = with_tokens(model_path, KIMI_TOKENS, KIMI_TEMPLATE)
    turn = (
        "Checking.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
        '{"city": "Paris"}<|tool_call_end|><|tool_call_begin|>functions.score:1<|tool_call_argument_begin|>'
        '{"answer": "sunny"}<|tool_call_end|><|tool_calls_section_end|>'
    )
    RecordingLoop.messages = []
    output, model = run(
        tokenizer,
        [turn, "It is 21 degrees."],
        loop_cls=RecordingLoop,
        format="kimi",
        max_parallel_calls=2,
        function_tool_path=tool_files["function_tool_path"],
    )
    assistant, weather, scored = RecordingLoop.messages[0][-3:]
    assert assistant == {
        "role": "assistant",
        "content": "Checking.",
        "tool_calls": [
            {
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                "id": "functions.get_weather:0",
            },
            {
                "type": "function",
                "function": {"name": "score", "arguments": {"answer": "sunny"}},
                "id": "functions.score:1",
            },
        ],
    }
    assert weather["tool_call_id"] == "functions.get_weather:0" and scored == {
        "role": "tool",
        "content": "scored sunny",
        "tool_call_id": "functions.score:1",
    }
    tool_turn = segments(tokenizer, output)[1][1]
    assert tool_turn.startswith("<|im_system|>tool<|im_middle|>## Return of functions.get_weather:0\n{")
    assert "<|im_system|>tool<|im_middle|>## Return of functions.score:1\nscored sunny<|im_end|>" in tool_turn


def test_the_parsers_stop_tokens_join_the_samples(model_path, tool_files):
    tokenizer = with_tokens(model_path, ["<|tool_call>", "<tool_call|>", '<|"|>'])
    eos, end = tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<tool_call|>")
    turn = '<|tool_call>call:get_weather{city:<|"|>Rome<|"|>}<tool_call|>'
    output, model = run(tokenizer, [turn, "ok"], format="gemma4", sampling={"stop_token_ids": [eos]}, **tool_files)
    assert [c["stop_token_ids"] for c in model.calls] == [[eos, end], [eos, end]]
    assert '"city": "Rome"' in segments(tokenizer, output)[1][1]


def test_gpt_oss_tool_turns_are_written_as_harmony_messages(model_path, tool_files):
    harmony = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|call|>", "<|return|>"]
    tokenizer = with_tokens(model_path, harmony)
    turn = '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Lima"}<|call|>'
    output, _ = run(tokenizer, [turn, "ok"], format="gpt-oss", **tool_files)
    weather = json.dumps({"city": "Lima", "temperature": 21, "unit": "celsius"})
    assert segments(tokenizer, output)[1] == (
        0,
        f"<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>{weather}<|end|>"
        "<|start|>assistant",
    )


def test_the_batch_always_has_veRLs_extra_fields_so_loops_concatenate():
    from verl.experimental.agent_loop.agent_loop import _InternalAgentLoopOutput
    from verl.experimental.agent_loop.postprocess import STABLE_EXTRA_FIELDS, SampleResult, pad_sample, samples_to_batch
    from verl.protocol import DataProto

    def result(extra):
        output = AgentLoopOutput(prompt_ids=[5, 6], response_ids=[7, 8], response_mask=[1, 0], extra_fields=extra)
        return SampleResult("loop", output, pad_sample(output, "loop", 4, 4, 0))

    tool_like = samples_to_batch([result({"turn_scores": [1.0], "tool_rewards": [0.5]})])
    single_like = samples_to_batch([result({})])
    for batch in (tool_like, single_like):
        assert set(STABLE_EXTRA_FIELDS) <= set(batch.non_tensor_batch)
    both = DataProto.concat([tool_like, single_like])
    assert list(both.non_tensor_batch["turn_scores"]) == [[1.0], None]
    assert list(both.non_tensor_batch["extras"]) == [None, None]
    output = AgentLoopOutput(prompt_ids=[5, 6], response_ids=[7], response_mask=[1], response_logprobs=[-0.5])
    assert output.mm_processor_kwargs is None
    internal = _InternalAgentLoopOutput.from_output(output, prompt_length=4, response_length=3, pad_id=0)
    assert internal.prompt_ids.tolist() == [[0, 0, 5, 6]] and internal.response_ids.tolist() == [[7, 0, 0]]
    assert internal.attention_mask.tolist() == [[0, 0, 1, 1, 1, 0, 0]]
    assert internal.response_logprobs.tolist() == [[-0.5, 0.0, 0.0]] and internal.num_turns == 0


def test_the_dataset_shows_the_function_tools_in_the_prompts(tokenizer, tool_files, tmp_path):
    from tests.utils.dataset.test_rl_dataset import row, write
    from verl.utils.dataset.rl_dataset import RLHFDataset

    path = write(tmp_path / "a.parquet", [row("What is 3 + 4?")])
    config = {"max_prompt_length": 128, "return_full_prompt": True, **tool_files}
    prompt = RLHFDataset(path, tokenizer, config)[0]["full_prompts"]
    assert prompt.startswith(
        "<|im_start|>system\nTools: calculator(expression), get_weather(city, unit), score(answer)"
    )
