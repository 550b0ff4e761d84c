"""The tool demo: the demo's arithmetic task solved with a calculator tool, by a tiny model taught in two stages.

:func:`ensure_tool_demo_assets` materialises, under ``$VERL_CACHE_DIR`` (default ``~/.cache/verl``)::

    <cache>/demo/tools-v<TOOL_DEMO_VERSION>/
        model/            fresh tiny Qwen2 (seed 0) + a tokenizer with <tool_call> … </tool_response> tokens and a
                          hermes chat template (the tools are listed in a system turn)
        tool_config.yaml  veRL's tool yaml: the calculator (verl.tools.calculator_tool.CalculatorTool)
        sft/              train.parquet, test.parquet: multi-turn transcripts (question → calculator call → the
                          tool's answer → the answer), for ``verl.trainer.fsdp_sft_trainer`` (data.multiturn.enable)
        rl/               train.parquet, test.parquet: the arithmetic questions, ``agent_name`` ``tool_agent``
        manifest.json     written last

A transcript, as the template renders it (each ``<...>`` marker one token)::

    <|im_start|>system\\nTools: calculator(expression)<|im_end|><|im_start|>user\\nWhat is 3 + 4?<|im_end|>
    <|im_start|>assistant\\n<tool_call>\\n{"name": "calculator", "arguments": {"expression": "3 + 4"}}\\n</tool_call>
    <|im_end|><|im_start|>user\\n<tool_response>\\n7\\n</tool_response><|im_end|><|im_start|>assistant\\n7<|im_end|>

(no newline between turns, so a conversation's tokens are exactly the concatenation of its turns' tokens — what the
tool agent loop appends turn by turn). The SFT transcripts use the demo's questions with other seeds than the RL rows.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from verl.tools.calculator_tool import CALCULATOR_SCHEMA, CalculatorTool
from verl.utils.demo import (
    DEMO_DATA_SOURCE,
    _question,
    _write_parquet,
    build_demo_tokenizer,
    make_arithmetic_rows,
    materialise,
    save_demo_model,
)

__all__ = [
    "TOOL_CHAT_TEMPLATE",
    "TOOL_DEMO_VERSION",
    "ToolDemoAssets",
    "ensure_tool_demo_assets",
    "tool_grpo_overrides",
    "tool_transcript",
]

# Bump when anything below changes what is written.
TOOL_DEMO_VERSION = 1

TOOL_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
TOOL_VOCAB_SIZE = 384
SFT_TRAIN_SIZE, SFT_TEST_SIZE, RL_TRAIN_SIZE, RL_TEST_SIZE = 2048, 64, 1024, 64
SFT_TRAIN_SEED, SFT_TEST_SEED, RL_TRAIN_SEED, RL_TEST_SEED = 11, 12, 1, 2

TOOL_CHAT_TEMPLATE = (
    "{%- if tools %}{{ '<|im_start|>system\\nTools: ' }}"
    "{%- for tool in tools %}{{ tool.function.name }}({{ tool.function.parameters.properties | list | join(', ') }})"
    "{%- if not loop.last %}{{ ', ' }}{% endif %}{%- endfor %}{{ '<|im_end|>' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{ '<|im_start|>user' }}{%- endif %}"
    "{{ '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{ '<|im_end|>' }}{%- endif %}"
    "{%- else %}"
    "{{ '<|im_start|>' + (message.role or '') + '\\n' + (message.content or '') }}"
    "{%- for call in message.tool_calls or [] %}"
    '{{ \'<tool_call>\\n{"name": "\' + call.function.name + \'", "arguments": \' }}'
    "{{ call.function.arguments | tojson }}{{ '}\\n</tool_call>' }}"
    "{%- endfor %}{{ '<|im_end|>' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)


@dataclass(frozen=True)
class ToolDemoAssets:
    """Paths of the materialised tool-demo assets."""

    model_path: str
    tool_config_path: str
    sft_train_files: str
    sft_val_files: str
    train_files: str
    val_files: str


def _expression(question: str) -> str:
    return question.removeprefix("What is ").removesuffix("?")


def tool_transcript(question: str, answer: int) -> list[dict[str, Any]]:
    """The conversation that answers ``question`` with one calculator call."""
    call = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": _expression(question)}}}
    return [
        {"role": "user", "content": question},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": str(answer)},
        {"role": "assistant", "content": str(answer)},
    ]


def _sft_rows(num_rows: int, seed: int, tools_json: str) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    rows = []
    for _ in range(num_rows):
        question, answer = _question(rng)
        messages = tool_transcript(question, answer)
        for message in messages:  # parquet wants one struct type: JSON-string arguments, as veRL's data has
            for call in message.get("tool_calls", []):
                call["function"]["arguments"] = json.dumps(call["function"]["arguments"])
        rows.append({"messages": messages, "tools": tools_json})
    return rows


def _rl_rows(num_rows: int, seed: int, split: str) -> list[dict[str, Any]]:
    return [{**row, "agent_name": "tool_agent"} for row in make_arithmetic_rows(num_rows, seed, split)]


def _corpus() -> Iterator[str]:
    """Tokenizer training text: rendered transcripts (without the special tokens), so the JSON pieces merge."""
    rng = random.Random(4321)
    for _ in range(2000):
        question, answer = _question(rng)
        arguments = json.dumps({"expression": _expression(question)})
        yield f"system\nTools: calculator(expression)user\n{question}"
        yield f'assistant\n\n{{"name": "calculator", "arguments": {arguments}}}\n'
        yield f"user\n\n{answer}\nassistant\n{answer}"


def _build(folder: str) -> None:
    tokenizer = build_demo_tokenizer(_corpus(), TOOL_VOCAB_SIZE, TOOL_TOKENS, TOOL_CHAT_TEMPLATE)
    save_demo_model(tokenizer, os.path.join(folder, "model"))
    entry = {"class_name": f"{CalculatorTool.__module__}.CalculatorTool", "config": {"type": "native"}}
    OmegaConf.save({"tools": [{**entry, "tool_schema": CALCULATOR_SCHEMA}]}, os.path.join(folder, "tool_config.yaml"))
    tools_json = json.dumps([CALCULATOR_SCHEMA])
    files = {
        "sft/train": _sft_rows(SFT_TRAIN_SIZE, SFT_TRAIN_SEED, tools_json),
        "sft/test": _sft_rows(SFT_TEST_SIZE, SFT_TEST_SEED, tools_json),
        "rl/train": _rl_rows(RL_TRAIN_SIZE, RL_TRAIN_SEED, "train"),
        "rl/test": _rl_rows(RL_TEST_SIZE, RL_TEST_SEED, "test"),
    }
    for name, rows in files.items():
        os.makedirs(os.path.join(folder, os.path.dirname(name)), exist_ok=True)
        _write_parquet(rows, os.path.join(folder, f"{name}.parquet"))
    with open(os.path.join(folder, "manifest.json"), "w") as f:
        json.dump({"version": TOOL_DEMO_VERSION, "data_source": DEMO_DATA_SOURCE}, f)


def ensure_tool_demo_assets(cache_dir: str | os.PathLike | None = None) -> ToolDemoAssets:
    """Materialise the tool-demo assets under ``cache_dir`` (default ``$VERL_CACHE_DIR`` or ``~/.cache/verl``)
    unless they are there; safe to call from several processes at once."""
    folder = materialise(cache_dir, f"tools-v{TOOL_DEMO_VERSION}", _build)
    return ToolDemoAssets(
        model_path=os.path.join(folder, "model"),
        tool_config_path=os.path.join(folder, "tool_config.yaml"),
        sft_train_files=os.path.join(folder, "sft", "train.parquet"),
        sft_val_files=os.path.join(folder, "sft", "test.parquet"),
        train_files=os.path.join(folder, "rl", "train.parquet"),
        val_files=os.path.join(folder, "rl", "test.parquet"),
    )


def tool_grpo_overrides(
    model_path: str | os.PathLike,
    train_files: str,
    val_files: str,
    workdir: Path,
    *,
    steps: int,
    lr: float,
    val_prompts: int,
) -> list[str]:
    """``main_ppo`` overrides of the tool demo's GRPO stage, sized for a CPU: from ``model_path`` (the SFT
    checkpoint), 16 questions × 4 samples a step, 48 response tokens over all turns, the hf engine in float32, one
    worker, ``steps`` steps at ``lr``, validation on ``val_prompts`` questions before and after, the file logger.
    The examples add how the conversations are run (the tool agent loop, or an agent through the gateway)."""
    return [
        f"actor_rollout_ref.model.path={model_path}",
        f"data.train_files={train_files}",
        f"data.val_files={val_files}",
        f"data.val_max_samples={val_prompts}",
        "data.train_batch_size=16",
        "data.max_prompt_length=32",
        "data.max_response_length=48",
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.rollout.dtype=float32",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=64",
        "actor_rollout_ref.actor.ppo_mini_batch_size=16",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=64",
        f"actor_rollout_ref.actor.optim.lr={lr}",
        "actor_rollout_ref.actor.fsdp_config.dtype=float32",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        f"trainer.total_training_steps={steps}",
        "trainer.val_before_train=true",
        f"trainer.test_freq={steps}",
        "trainer.save_freq=-1",
        f"trainer.default_local_dir={workdir / 'ckpt'}",
        "trainer.logger=[console,file]",
    ]
