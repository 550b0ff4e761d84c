"""An LLM judge made and used on a CPU: SFT a tiny judge, then GRPO a tiny policy scored only by that judge.

    python examples/generative_reward/judge_sft_then_grpo.py --workdir /tmp/judge_demo

1. Judge data (``build_judge_data.py``): answers to the demo's arithmetic questions — random tokens, far and near
   numbers, the right one, bare or followed by more text — each with the grade ``score: 0`` … ``score: 6``.
2. ``python -m verl.trainer.fsdp_sft_trainer`` teaches a fresh tiny model to say that grade. The script then asks it
   (greedy, as the run will) about held-out answers and prints how often its grade is right.
3. ``python -m verl.trainer.main_ppo`` trains the demo's untrained policy with GRPO. Its reward is the judge's only:
   ``reward.reward_model.enable`` serves the judge behind the run's reward router, and ``judge_reward.py`` (veRL's
   ``compute_score`` signature) asks it through ``reward_router_address`` and turns ``score: N`` into ``N / 6``.
   Extra ``key=value`` arguments go to ``main_ppo`` (e.g. ``trainer.v1.trainer_mode=separate_async`` with
   ``reward.reward_model.enable_resource_pool=true`` to give the judge a pool of its own).

The metrics of both runs are written as JSON lines to ``<workdir>/{judge_sft,rl}/metrics.jsonl``; the script prints
the policy's validation score (the judge's grade) and exact-answer rate at each validation.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
from build_judge_data import build, vocabulary_of

from verl.utils.demo_runs import demo_grpo_overrides, read_metrics, run_module

HERE = Path(__file__).resolve().parent
JUDGE_BATCH = 64


def judge_agreement(model_dir: Path, rows: pd.DataFrame) -> float:
    """The fraction of ``rows`` whose grade the judge at ``model_dir`` says exactly (greedy, as in the run)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    prompts = [tokenizer.apply_chat_template(list(p), add_generation_prompt=True, tokenize=False) for p in rows.prompt]
    batch = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=12, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    said = tokenizer.batch_decode(out[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
    return sum(s.strip() == r for s, r in zip(said, rows.response, strict=True)) / len(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--cache-dir", default=None, help="where the demo assets live (default $VERL_CACHE_DIR)")
    parser.add_argument("--judge-steps", type=int, default=1024)
    parser.add_argument("--judge-save-freq", type=int, default=0, help="also keep earlier judges (0: the last)")
    parser.add_argument("--rl-steps", type=int, default=60)
    parser.add_argument("--rl-lr", type=float, default=3e-3)
    parser.add_argument("--val-prompts", type=int, default=64)
    args, extra = parser.parse_known_args()

    from verl.utils.demo import ensure_demo_assets

    assets = ensure_demo_assets(args.cache_dir)
    work = args.workdir.resolve()
    data, sft, rl = work / "judge_data", work / "judge_sft", work / "rl"
    data.mkdir(parents=True, exist_ok=True)
    vocabulary = vocabulary_of(assets.tokenizer_path)
    rows = build(assets.train_files, 0, vocabulary)
    rows.to_parquet(data / "train.parquet")
    epochs = -(-args.judge_steps * JUDGE_BATCH // len(rows))  # the lr schedule spans whole epochs (veRL's rule)
    held_out = build(assets.val_files, 1, vocabulary)
    held_out.to_parquet(data / "val.parquet")

    run_module(
        "verl.trainer.fsdp_sft_trainer",
        sft,
        sft / "metrics.jsonl",
        f"data.train_files={data / 'train.parquet'}",
        f"data.val_files={data / 'val.parquet'}",
        "data.prompt_key=prompt",
        "data.response_key=response",
        f"data.train_batch_size={JUDGE_BATCH}",
        f"data.micro_batch_size_per_gpu={JUDGE_BATCH}",
        "data.max_length=64",
        f"model.partial_pretrain={assets.model_path}",
        "optim.lr=3e-3",
        f"trainer.total_epochs={epochs}",
        f"trainer.total_training_steps={args.judge_steps}",
        f"trainer.test_freq={args.judge_steps}",
        f"trainer.save_freq={args.judge_save_freq or args.judge_steps}",
        f"trainer.default_local_dir={sft / 'ckpt'}",
        "trainer.logger=[console,file]",
    )
    judge = sft / "ckpt" / f"global_step_{args.judge_steps}" / "huggingface"
    print(f"judge: right grade on {judge_agreement(judge, held_out.head(512)):.1%} of 512 held-out answers")

    run_module(
        "verl.trainer.main_ppo",
        rl,
        rl / "metrics.jsonl",
        *demo_grpo_overrides(assets, rl, steps=args.rl_steps, lr=args.rl_lr, val_prompts=args.val_prompts),
        f"reward.custom_reward_function.path={HERE / 'judge_reward.py'}",
        "reward.reward_model.enable=true",
        f"reward.reward_model.model_path={judge}",
        "reward.reward_model.rollout.dtype=float32",
        "reward.reward_model.rollout.prompt_length=48",
        "reward.reward_model.rollout.response_length=12",
        *extra,
    )
    for step, metrics in read_metrics(rl / "metrics.jsonl"):
        score = next((v for k, v in metrics.items() if k.startswith("val-aux/") and k.endswith("/score/mean@1")), None)
        exact = next((v for k, v in metrics.items() if k.startswith("val-core/") and k.endswith("/acc/mean@1")), None)
        if score is not None:
            print(f"step {step}: validation score {score:.3f} (the judge's grade / 6), exact answers {exact:.3f}")


if __name__ == "__main__":
    main()
