"""The tool agent loop, veRL's tool and interaction interfaces, and the tools' YAML loading.

The loop runs in-process with the tool demo's real tokenizer and chat template, real tools (the calculator, the user
tools of ``user_tools.py`` loaded by YAML) and the real Gsm8k interaction. Only the model is scripted here (a stand-in
for the rollout servers that returns given turns), so that each limit — turns, parallel calls, truncation, the
response budget — is hit exactly; ``test_tool_training.py`` runs the real model end to end.
"""

from __future__ import annotations

import asyncio
import json
import textwrap
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.experimental import user_tools
from verl.experimental.agent_loop.agent_loop import DictConfigWrap, default_agent_loop, registered_agent_loops
from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop, truncate_tool_response
from verl.experimental.agent_loop.tool_parser import HermesToolParser, ToolParser
from verl.tools.base_tool import ToolUnavailableError
from verl.tools.calculator_tool import evaluate_expression
from verl.tools.tool_registry import initialize_tools_from_config
from verl.utils.demo_tools import ensure_tool_demo_assets
from verl.utils.tokenizer import hf_tokenizer
from verl.workers.rollout.replica import TokenOutput

QUESTION = [{"role": "user", "content": "What is 3 + 4?"}]
RESPONSE_LENGTH = 128
MULTI_TURN_DEFAULTS = {
    "enable": True,
    "max_assistant_turns": None,
    "max_user_turns": None,
    "max_parallel_calls": 1,
    "max_tool_response_length": 256,
    "tool_response_truncate_side": "middle",
    "tool_config_path": None,
    "function_tool_path": None,
    "interaction_config_path": None,
    "format": "hermes",
}


def call(name: str, **arguments) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    # the same cache as test_tool_training.py: a session builds the tool demo once
    assets = ensure_tool_demo_assets(tmp_path_factory.getbasetemp() / "verl_cache")
    return hf_tokenizer(assets.model_path)


@pytest.fixture(scope="module")
def tools_yaml(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("tools") / "tools.yaml"
    schema = textwrap.dedent(
        """\
        tool_schema:
              type: function
              function:
                name: {name}
                description: a test tool
                parameters: {{type: object, properties: {{{arg}: {{type: string}}}}, required: [{arg}]}}"""
    )
    entries = [("calculator_tool.CalculatorTool", None, "", "verl.tools")]
    entries += [(f"user_tools.{c}", n, a, "tests.experimental") for c, n, a in _USER_TOOLS]
    lines = ["tools:"]
    for cls, name, arg, package in entries:
        lines.append(f"  - class_name: {package}.{cls}")
        lines.append("    config: {type: native" + (", repeat: 3" if name == "echo" else "") + "}")
        if name:
            lines.append("    " + schema.format(name=name, arg=arg))
    path.write_text("\n".join(lines) + "\n")
    return str(path)


_USER_TOOLS = [("EchoTool", "echo", "text"), ("OldStyleTool", "old", "x"), ("BrokenTool", "broken", "x")]
_USER_TOOLS += [("SlowTool", "slow", "x")]


class ScriptedModel:
    """Stands in for the rollout servers (``server_manager.generate``): answers each turn with the next scripted text
    and EOS, at most ``max_tokens`` tokens, and records the calls."""

    def __init__(self, tokenizer, turns: list[str]) -> None:
        self.tokenizer, self.turns, self.calls = tokenizer, list(turns), []

    async def generate(self, request_id, *, prompt_ids, sampling_params, image_data=None, video_data=None):
        self.calls.append({"request_id": request_id, "prompt_ids": list(prompt_ids), **sampling_params})
        ids = self.tokenizer.encode(self.turns.pop(0), add_special_tokens=False) + [self.tokenizer.eos_token_id]
        ids = ids[: sampling_params["max_tokens"]]
        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids), num_preempted=0)


def run_loop(tokenizer, turns, response_length=RESPONSE_LENGTH, prompt=QUESTION, fields=None, **multi_turn):
    config = OmegaConf.create(
        {
            "actor_rollout_ref": {
                "rollout": {
                    "prompt_length": 64,
                    "response_length": response_length,
                    "multi_turn": {**MULTI_TURN_DEFAULTS, **multi_turn},
                }
            },
            "data": {},
        }
    )
    model = ScriptedModel(tokenizer, turns)

    async def go():
        loop = ToolAgentLoop(trainer_config=DictConfigWrap(config), server_manager=model, tokenizer=tokenizer)
        return await loop.run({"temperature": 1.0}, raw_prompt=prompt, **(fields or {}))

    return asyncio.run(go()), model


def segments(tokenizer, output) -> list[tuple[int, str]]:
    """The response as (mask, text) runs."""
    runs: list[tuple[int, list[int]]] = []
    for token, mask in zip(output.response_ids, output.response_mask):
        if runs and runs[-1][0] == mask:
            runs[-1][1].append(token)
        else:
            runs.append((mask, [token]))
    return [(mask, tokenizer.decode(ids)) for mask, ids in runs]


def test_a_tool_call_is_run_answered_masked_and_the_conversation_stays_on_its_server(tokenizer, tools_yaml):
    output, model = run_loop(tokenizer, [call("calculator", expression="3 + 4"), "7"], tool_config_path=tools_yaml)
    tool_turn = "<|im_start|>user\n<tool_response>\n7\n</tool_response><|im_end|><|im_start|>assistant\n"
    assert segments(tokenizer, output) == [
        (1, call("calculator", expression="3 + 4") + "<|im_end|>"),
        (0, tool_turn),
    ] + [(1, "7<|im_end|>")]
    # the prompt shows the tools; the second turn continues the first's tokens on the same request id
    assert tokenizer.decode(output.prompt_ids).startswith(
        "<|im_start|>system\nTools: calculator(expression), echo(text)"
    )
    first, second = model.calls
    assert second["request_id"] == first["request_id"]
    assert second["prompt_ids"] == output.prompt_ids + output.response_ids[:-2]
    assert second["max_tokens"] == RESPONSE_LENGTH - (len(output.response_ids) - 2)  # what is left of the budget
    log_probs = [lp for lp, m in zip(output.response_logprobs, output.response_mask) if not m]
    assert log_probs and set(log_probs) == {0.0}
    assert output.num_turns == 4 and output.extra_fields["tool_call_counts"] == 1
    assert output.metrics.model_dump()["num_tool_calls"] == 1 and output.metrics.model_dump()["tool_errors"] == 0
    assert output.metrics.tool_calls > 0 and output.metrics.generate_sequences > 0


def test_limits_turns_parallel_calls_and_the_response_budget(tokenizer, tools_yaml):
    two_calls = call("echo", text="a") + call("echo", text="b")
    # max_assistant_turns: the first turn's calls are not run
    output, model = run_loop(tokenizer, [two_calls], tool_config_path=tools_yaml, max_assistant_turns=1)
    assert len(model.calls) == 1 and set(output.response_mask) == {1} and output.num_turns == 2
    # max_parallel_calls=1 runs the first call of the turn; the second is dropped and counted
    output, _ = run_loop(tokenizer, [two_calls, "done"], tool_config_path=tools_yaml)
    assert "aaa" in segments(tokenizer, output)[1][1] and "bbb" not in tokenizer.decode(output.response_ids)
    assert output.metrics.model_dump()["tool_calls_dropped"] == 1
    output, _ = run_loop(tokenizer, [two_calls, "done"], tool_config_path=tools_yaml, max_parallel_calls=2)
    tool_turn = segments(tokenizer, output)[1][1]
    assert tool_turn.count("<tool_response>") == 2 and tool_turn.index("aaa") < tool_turn.index("bbb")
    assert output.extra_fields["tool_rewards"] == [0.5, 0.5] and output.extra_fields["tool_call_counts"] == 2
    # max_user_turns=1: after one tool turn the model's next turn is the last
    output, model = run_loop(tokenizer, [two_calls, two_calls], tool_config_path=tools_yaml, max_user_turns=1)
    assert len(model.calls) == 2 and output.num_turns == 4
    # a tool turn that would fill the response ends the conversation without it (it ends on model tokens)
    length = len(tokenizer.encode(two_calls, add_special_tokens=False)) + 3
    output, model = run_loop(tokenizer, [two_calls], tool_config_path=tools_yaml, response_length=length)
    assert len(model.calls) == 1 and set(output.response_mask) == {1}


@pytest.mark.parametrize(
    ("side", "expected"),
    [("left", "(truncated)...aaaaa"), ("right", "tagaa...(truncated)"), ("middle", "ta...(truncated)...aa")],
)
def test_long_tool_responses_are_truncated_as_veRL_does(tokenizer, tools_yaml, side, expected):
    assert truncate_tool_response("tag" + "a" * 30, 5, side) == expected
    fields = {"tools_kwargs": {"echo": {"create_kwargs": {"tag": "tag"}}}}
    output, _ = run_loop(
        tokenizer,
        [call("echo", text="a" * 10), "ok"],
        fields=fields,
        tool_config_path=tools_yaml,
        max_tool_response_length=5,
        tool_response_truncate_side=side,
    )
    assert f"<tool_response>\n{expected}\n</tool_response>" in segments(tokenizer, output)[1][1]
    assert user_tools.RELEASED  # every instance was released


def test_failing_calls_hand_the_model_an_error_and_are_counted(tokenizer, tools_yaml):
    turn = call("broken", x="1") + call("nosuch", x="1") + call("slow", x="1") + "<tool_call>{not json</tool_call>"
    turn += call("old", x="9")
    output, _ = run_loop(tokenizer, [turn, "ok"], 512, tool_config_path=tools_yaml, max_parallel_calls=4)
    tool_turn = segments(tokenizer, output)[1][1]
    assert "Error executing tool 'broken': the database is down" in tool_turn
    assert "Unknown function 'nosuch'. Available tools:" in tool_turn
    assert "Error executing tool 'slow': timed out" in tool_turn
    assert "old:9" in tool_turn  # veRL's older return types still work
    metrics = output.metrics.model_dump()
    assert (metrics["num_tool_calls"], metrics["tool_errors"], metrics["tool_timeouts"]) == (4, 3, 1)


def test_a_tool_that_cannot_run_safely_stops_the_rollout(tokenizer, tmp_path):
    path = tmp_path / "tools.yaml"
    path.write_text(
        "tools:\n  - class_name: tests.experimental.user_tools.UnavailableTool\n    config: {type: native}\n"
        "    tool_schema: {type: function, function: {name: risky, description: d, parameters: "
        "{type: object, properties: {}, required: []}}}\n"
    )
    with pytest.raises(ToolUnavailableError, match="no isolation"):
        run_loop(tokenizer, [call("risky")], tool_config_path=str(path))
    # a sandbox that cannot be isolated refuses when the YAML is loaded (at start-up), naming the file and entry
    path.write_text(
        "tools:\n  - class_name: verl.tools.python_sandbox_tool.PythonSandboxTool\n"
        "    config: {type: native, unshare_path: /nonexistent/unshare}\n"
    )
    with pytest.raises(ToolUnavailableError, match=r"tools\[0\] \(verl.tools.python_sandbox_tool.PythonSandboxTool\)"):
        initialize_tools_from_config(str(path))


def test_a_simulated_user_gives_feedback_until_the_answer_is_right(tokenizer, tmp_path):
    path = tmp_path / "interactions.yaml"
    path.write_text(
        "interaction:\n  - name: gsm8k\n    class_name: verl.interactions.gsm8k_interaction.Gsm8kInteraction\n"
        "    config: {}\n"
    )
    fields = {"extra_info": {"interaction_kwargs": {"name": "gsm8k", "ground_truth": "7"}}}
    output, model = run_loop(tokenizer, ["5", "7"], fields=fields, interaction_config_path=str(path))
    parts = segments(tokenizer, output)
    assert [m for m, _ in parts] == [1, 0, 1] and "Your response is incorrect!" in parts[1][1]
    assert output.extra_fields["turn_scores"] == [0.0, 1.0] and len(model.calls) == 2
    # max_user_turns bounds the feedback rounds
    output, model = run_loop(
        tokenizer, ["5", "6", "8"], fields=fields, interaction_config_path=str(path), max_user_turns=1
    )
    assert len(model.calls) == 2
    with pytest.raises(ValueError, match="interaction 'other'.*available: \\['gsm8k'\\]"):
        run_loop(tokenizer, ["5"], fields={"interaction_kwargs": {"name": "other"}}, interaction_config_path=str(path))


def test_tool_yaml_errors_name_the_file_and_the_entry(tmp_path):
    cases = {
        "missing.yaml": None,
        "bad.yaml": "tools: [unclosed",
        "notools.yaml": "other: 1\n",
        "noclass.yaml": "tools:\n  - config: {type: native}\n",
        "notatool.yaml": "tools:\n  - class_name: tests.experimental.user_tools.NotATool\n",
        "noimport.yaml": "tools:\n  - class_name: nowhere.Tool\n",
        "mcp.yaml": "tools:\n  - class_name: verl.tools.calculator_tool.CalculatorTool\n    config: {type: mcp}\n",
        "schema.yaml": "tools:\n  - class_name: verl.tools.calculator_tool.CalculatorTool\n    tool_schema: {a: 1}\n",
    }
    expected = {
        "missing.yaml": "no such file",
        "bad.yaml": "not a YAML file",
        "notools.yaml": "top-level 'tools' list",
        "noclass.yaml": r"tools\[0\]: needs 'class_name'",
        "notatool.yaml": "is not a verl.tools.base_tool.BaseTool subclass",
        "noimport.yaml": "cannot import 'nowhere.Tool'",
        "mcp.yaml": "config.type='mcp' is not supported",
        "schema.yaml": "tool_schema is not an OpenAI function schema",
    }
    for name, text in cases.items():
        path = tmp_path / name
        if text is not None:
            path.write_text(text)
        with pytest.raises((ValueError, ImportError, TypeError, FileNotFoundError), match=expected[name]) as error:
            initialize_tools_from_config(str(path))
        assert str(path) in str(error.value)


def test_validation_loads_the_tool_yaml_and_multi_turn_picks_the_tool_agent(tmp_path):
    from tests.trainer.config.test_validate import VALID
    from verl.trainer.config.validate import ConfigError, merged, validate_config

    missing = str(tmp_path / "tools.yaml")
    with pytest.raises(ConfigError, match=f"multi_turn.tool_config_path: tool config '{missing}': no such file"):
        validate_config(merged([*VALID, f"actor_rollout_ref.rollout.multi_turn.tool_config_path={missing}"]))
    with pytest.raises(ConfigError, match="multi_turn.format='xml': no tool-call parser of that name; known: \\['deep"):
        validate_config(merged([*VALID, "actor_rollout_ref.rollout.multi_turn.format=xml"]), check_environment=False)
    assert "tool_agent" in registered_agent_loops()
    rollout = OmegaConf.create({"agent": {"default_agent_loop": "single_turn_agent"}, "multi_turn": {"enable": True}})
    assert default_agent_loop(rollout) == "tool_agent"
    rollout.agent.default_agent_loop = "my_loop"
    assert default_agent_loop(rollout) == "my_loop"


def test_hermes_parser_and_calculator():
    parser = ToolParser.get_tool_parser("hermes", tokenizer=None)
    assert isinstance(parser, HermesToolParser)
    content, calls, rejected = parser.parse_text(
        "hi " + call("calculator", expression="2 * (3 + 4)") + '<tool_call>{"arguments": {}}</tool_call>'
    )
    assert content == "hi " and [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("calculator", {"expression": "2 * (3 + 4)"})
    ]
    assert len(rejected) == 1 and "KeyError" in rejected[0]
    assert evaluate_expression("2 * (3 + 4)") == 14 and evaluate_expression("7 / 2") == 3.5
    for bad in ("__import__('os')", "2 ** 1000", "1 / 0", "x + 1"):
        with pytest.raises(ValueError):
            evaluate_expression(bad)
    with pytest.raises(ValueError, match="Unknown tool parser: 'xml'"):
        ToolParser.get_tool_parser("xml", tokenizer=None)


def test_user_tool_plugs_in_by_yaml(tools_yaml):
    tools = {tool.name: tool for tool in initialize_tools_from_config(tools_yaml)}
    assert sorted(tools) == ["broken", "calculator", "echo", "old", "slow"]
    assert isinstance(tools["echo"], user_tools.EchoTool) and tools["echo"].repeat == 3
    assert Path(tools_yaml).is_file()


def test_the_sandboxed_python_tool_answers_the_model(tokenizer, tmp_path):
    path = tmp_path / "tools.yaml"
    path.write_text(
        "tools:\n  - class_name: verl.tools.python_sandbox_tool.PythonSandboxTool\n"
        "    config: {type: native, wall_seconds: 5, cpu_seconds: 2}\n"
    )
    code = "import os\nprint(6 * 7, os.getcwd())\nopen('/etc/hostname').read()"
    output, _ = run_loop(tokenizer, [call("code_interpreter", code=code), "42"], 1024, tool_config_path=str(path))
    tool_turn = segments(tokenizer, output)[1][1]
    assert "42 /work" in tool_turn and "FileNotFoundError" in tool_turn and "[error: exit code 1]" in tool_turn
    assert tokenizer.decode(output.prompt_ids).startswith("<|im_start|>system\nTools: code_interpreter(code)")
