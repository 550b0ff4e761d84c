"""Train an existing OpenAI-client agent through the gateway: GRPO of the tool demo's model on the calculator task.

    python examples/tool_agent/calculator_sft_then_grpo.py --workdir /tmp/tool_demo     # the SFT checkpoint
    python examples/agent_gateway/calculator_agent_grpo.py --workdir /tmp/gateway_demo \\
        --model /tmp/tool_demo/sft/ckpt/global_step_60/huggingface

The agent is ``calculator_agent.py`` beside this script: plain ``openai`` code that asks, runs the calculator when the
model calls it, and answers. Each sample runs it once (``--as-program``: as a subprocess with ``OPENAI_BASE_URL`` /
``OPENAI_API_KEY`` in its environment; by default as a coroutine in the agent-loop worker). The gateway records the
tokens the policy generated, turn by turn, and the run's reward function scores the conversation, as for the tool
agent loop. What changes against the tool-agent run is only who drives the conversation: the agent's code, through
HTTP. Extra ``key=value`` arguments go to ``main_ppo``. The run's metrics are written to
``<workdir>/rl/metrics.jsonl``; the script prints the score and the gateway's counts per step.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
AGENT_NAME = "calculator_agent"


def write_agent_data(source: str, target: Path) -> str:
    """A copy of the demo's RL parquet whose rows name the gateway loop (``agent_name``)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(source)
    column = pa.array([AGENT_NAME] * table.num_rows)
    table = table.set_column(table.schema.get_field_index("agent_name"), "agent_name", column)
    target.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, target)
    return str(target)


def write_agent_yaml(path: Path, as_program: bool, timeout_s: float, drafts: bool = False) -> str:
    """The agent-loop YAML: the gateway loop running ``calculator_agent.py`` (with two first-turn drafts:
    ``solve_with_drafts``)."""
    from omegaconf import OmegaConf

    agent = HERE / "calculator_agent.py"
    entry = {"name": AGENT_NAME, "_target_": "verl.experimental.agent_gateway.GatewayAgentLoop"}
    if as_program:
        entry["command"] = [sys.executable, str(agent), *(["--drafts"] if drafts else [])]
    else:
        entry["agent"] = f"{agent}:{'solve_with_drafts' if drafts else 'solve'}"
    entry.update({"timeout_s": timeout_s, "max_requests": 8})
    path.parent.mkdir(parents=True, exist_ok=True)
    OmegaConf.save([entry], path)
    return str(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--model", type=Path, required=True, help="the tool demo's SFT checkpoint (HF folder)")
    parser.add_argument("--cache-dir", default=None, help="where the demo assets live (default $VERL_CACHE_DIR)")
    parser.add_argument("--rl-steps", type=int, default=30)
    parser.add_argument("--rl-lr", type=float, default=3e-4)
    parser.add_argument("--val-prompts", type=int, default=32)
    parser.add_argument("--as-program", action="store_true", help="run the agent as a subprocess per sample")
    parser.add_argument("--agent-timeout", type=float, default=120.0)
    parser.add_argument(
        "--drafts", action="store_true", help="two drafts of the first turn: two trajectories per sample, both trained"
    )
    args, extra = parser.parse_known_args()

    from verl.utils.demo_runs import read_metrics, run_module
    from verl.utils.demo_tools import ensure_tool_demo_assets, tool_grpo_overrides

    assets = ensure_tool_demo_assets(args.cache_dir)
    work = args.workdir.resolve()
    rl = work / "rl"
    train = write_agent_data(assets.train_files, work / "data" / "train.parquet")
    val = write_agent_data(assets.val_files, work / "data" / "test.parquet")
    run_module(
        "verl.trainer.main_ppo",
        rl,
        rl / "metrics.jsonl",
        *tool_grpo_overrides(
            args.model.resolve(), train, val, rl, steps=args.rl_steps, lr=args.rl_lr, val_prompts=args.val_prompts
        ),
        "actor_rollout_ref.rollout.agent.agent_loop_config_path="
        + write_agent_yaml(work / "agents.yaml", args.as_program, args.agent_timeout, args.drafts),
        "actor_rollout_ref.rollout.multi_turn.format=hermes",
        *extra,
    )
    for step, data in read_metrics(rl / "metrics.jsonl"):
        if "critic/score/mean" in data:
            print(
                f"step {step}: score {data['critic/score/mean']:.3f}, "
                f"requests {data.get('agent_loop/gateway_requests', 0):.0f}, "
                f"prefix mismatches {data.get('agent_loop/gateway_prefix_mismatches', 0):.0f}, "
                f"re-tokenization drift {data.get('agent_loop/gateway_retokenization_drift', 0):.0f}"
            )


if __name__ == "__main__":
    main()
