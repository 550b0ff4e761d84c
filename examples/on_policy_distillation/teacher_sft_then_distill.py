"""On-policy distillation on a CPU: SFT a tiny teacher on the arithmetic task, then distil it into a fresh student.

    python examples/on_policy_distillation/teacher_sft_then_distill.py --workdir /tmp/opd_demo

1. ``python -m verl.trainer.fsdp_sft_trainer`` teaches the demo's untrained model the arithmetic task (question →
   answer, from the task's own parquet files): the teacher.
2. ``python -m verl.trainer.main_ppo`` with ``distillation.enabled=true`` trains another untrained copy (the
   student) on its own samples: the teacher, served on a pool of its own, gives its 16 most likely next tokens and
   their log-probs after every prefix the student sampled, and the student's loss is the forward KL over them
   (``loss_mode=forward_kl_topk``). ``--task-rewards`` keeps GRPO on the task's rule reward beside it
   (``use_task_rewards``); without it the student learns from the teacher alone. Extra ``key=value`` arguments go
   to ``main_ppo`` (e.g. ``distillation.distillation_loss.loss_mode=k3``: from an untrained student, whose samples
   the teacher finds very unlikely, k3 sits at its clamp of 10 a token and passes no gradient).

The metrics of both runs are JSON lines in ``<workdir>/{teacher_sft,distill}/metrics.jsonl``; the script prints the
student's distillation loss (its forward KL to the teacher over the teacher's top-16, on the student's own samples)
and its validation score (the task's rule reward) and exact answers. The student is saved four times during the
run; its reverse KL to the teacher, KL(student ‖ teacher) over the whole vocabulary on its own samples of the
held-out questions (``reverse_kl.py``), is printed for the untrained student and each save.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from reverse_kl import reverse_kl

from verl.utils.demo_runs import demo_grpo_overrides, read_metrics, run_module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--cache-dir", default=None, help="where the demo assets live (default $VERL_CACHE_DIR)")
    parser.add_argument("--teacher-steps", type=int, default=400)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--task-rewards", action="store_true", help="keep the task's GRPO loss beside distillation")
    parser.add_argument("--val-prompts", type=int, default=64)
    args, extra = parser.parse_known_args()

    from verl.utils.demo import ensure_demo_assets

    assets = ensure_demo_assets(args.cache_dir)
    work = args.workdir.resolve()
    sft, rl = work / "teacher_sft", work / "distill"
    run_module(
        "verl.trainer.fsdp_sft_trainer",
        sft,
        sft / "metrics.jsonl",
        f"data.train_files={assets.train_files}",
        f"data.val_files={assets.val_files}",
        "data.prompt_key=prompt",
        "data.response_key=reward_model",
        "data.response_dict_keys=[ground_truth]",
        "data.train_batch_size=64",
        "data.micro_batch_size_per_gpu=64",
        "data.max_length=32",
        f"model.partial_pretrain={assets.model_path}",
        "optim.lr=3e-3",
        f"trainer.total_epochs={-(-args.teacher_steps * 64 // 1024)}",
        f"trainer.total_training_steps={args.teacher_steps}",
        f"trainer.test_freq={args.teacher_steps}",
        f"trainer.save_freq={args.teacher_steps}",
        f"trainer.default_local_dir={sft / 'ckpt'}",
        "trainer.logger=[console,file]",
    )
    teacher = sft / "ckpt" / f"global_step_{args.teacher_steps}" / "huggingface"
    run_module(
        "verl.trainer.main_ppo",
        rl,
        rl / "metrics.jsonl",
        *demo_grpo_overrides(
            assets, rl, steps=args.steps, lr=args.lr, val_prompts=args.val_prompts, save_freq=max(1, args.steps // 4)
        ),
        "distillation.enabled=true",
        "distillation.n_gpus_per_node=1",
        "distillation.nnodes=1",
        f"distillation.teacher_models.teacher_model.model_path={teacher}",
        "distillation.distillation_loss.loss_mode=forward_kl_topk",
        "distillation.distillation_loss.topk=16",
        f"distillation.distillation_loss.use_task_rewards={str(args.task_rewards).lower()}",
        *extra,
    )
    for step, metrics in read_metrics(rl / "metrics.jsonl"):
        exact = next((v for k, v in metrics.items() if k.startswith("val-core/") and k.endswith("/acc/mean@1")), None)
        score = next((v for k, v in metrics.items() if k.startswith("val-aux/") and k.endswith("/score/mean@1")), None)
        loss = metrics.get("actor/distillation/loss")
        parts = [f"step {step}:"]
        if loss is not None:
            parts.append(f"distillation loss {loss:.4f}")
        if score is not None:
            parts.append(f"validation score {score:.3f}, exact answers {exact:.3f}")
        if len(parts) > 1:
            print(" ".join(parts))
    saves = sorted(
        (int(p.name.rsplit("_", 1)[1]), p / "actor" / "huggingface") for p in (rl / "ckpt").glob("global_step_*")
    )
    for step, student in [(0, Path(assets.model_path)), *saves]:
        value = reverse_kl(student, teacher, assets.val_files, prompts=args.val_prompts)
        print(f"step {step}: reverse KL(student ‖ teacher) {value:.3f} nats a token")


if __name__ == "__main__":
    main()
