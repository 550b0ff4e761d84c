"""Tool use learned end to end on a CPU: SFT a tiny model on calculator transcripts, then GRPO with the tool agent.

    python examples/tool_agent/calculator_sft_then_grpo.py --workdir /tmp/tool_demo

1. The tool-demo assets (``verl.utils.demo_tools``): a fresh tiny Qwen2 whose tokenizer has ``<tool_call>`` …
   ``</tool_response>`` tokens and a hermes chat template, veRL's tool YAML with the calculator, SFT transcripts
   (question → ``calculator`` call → the tool's answer → the answer) and the arithmetic questions for RL.
2. ``python -m verl.trainer.fsdp_sft_trainer`` on the transcripts (multi-turn SFT: the loss is on the assistant turns).
3. ``python -m verl.trainer.main_ppo`` from the SFT checkpoint with ``multi_turn.enable=True`` and the tool YAML: the
   model's real generations are parsed for tool calls, the calculator runs, its answers are appended (masked out of the
   loss) and the model continues; the reward scores the final turn. Extra ``key=value`` arguments go to ``main_ppo``.

The metrics of both runs are written as JSON lines to ``<workdir>/{sft,rl}/metrics.jsonl``; the script prints the RL
run's score, tool-call counts and tool errors per step.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from verl.utils.demo_runs import read_metrics, run_module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--cache-dir", default=None, help="where the demo assets live (default $VERL_CACHE_DIR)")
    parser.add_argument("--sft-steps", type=int, default=60)
    parser.add_argument("--rl-steps", type=int, default=30)
    parser.add_argument("--rl-lr", type=float, default=3e-4)
    parser.add_argument("--val-prompts", type=int, default=32)
    args, extra = parser.parse_known_args()

    from verl.utils.demo_tools import ensure_tool_demo_assets, tool_grpo_overrides

    assets = ensure_tool_demo_assets(args.cache_dir)
    work = args.workdir.resolve()
    sft, rl = work / "sft", work / "rl"
    run_module(
        "verl.trainer.fsdp_sft_trainer",
        sft,
        sft / "metrics.jsonl",
        f"data.train_files={assets.sft_train_files}",
        f"data.val_files={assets.sft_val_files}",
        "data.multiturn.enable=true",
        "data.multiturn.messages_key=messages",
        "data.multiturn.tools_key=tools",
        "data.train_batch_size=32",
        "data.micro_batch_size_per_gpu=32",
        "data.max_length=64",
        f"model.partial_pretrain={assets.model_path}",
        "optim.lr=3e-3",
        "trainer.total_epochs=1",
        f"trainer.total_training_steps={args.sft_steps}",
        f"trainer.test_freq={args.sft_steps}",
        f"trainer.save_freq={args.sft_steps}",
        f"trainer.default_local_dir={sft / 'ckpt'}",
        "trainer.logger=[console,file]",
    )
    model = sft / "ckpt" / f"global_step_{args.sft_steps}" / "huggingface"
    run_module(
        "verl.trainer.main_ppo",
        rl,
        rl / "metrics.jsonl",
        *tool_grpo_overrides(
            model,
            assets.train_files,
            assets.val_files,
            rl,
            steps=args.rl_steps,
            lr=args.rl_lr,
            val_prompts=args.val_prompts,
        ),
        "actor_rollout_ref.rollout.multi_turn.enable=true",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={assets.tool_config_path}",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3",
        *extra,
    )
    for step, data in read_metrics(rl / "metrics.jsonl"):
        if "critic/score/mean" in data:
            print(
                f"step {step}: score {data['critic/score/mean']:.3f}, "
                f"tool calls {data.get('agent_loop/num_tool_calls', 0):.0f}, "
                f"tool errors {data.get('agent_loop/tool_errors', 0):.0f}"
            )


if __name__ == "__main__":
    main()
