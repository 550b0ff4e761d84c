"""Training runs scored by a served judge: veRL's quickstart with ``reward.reward_model.enable`` and a judge
function written for veRL (it asks the judge through ``reward_router_address``), under the ``rate_limited``
manager's run-wide limits — in ``sync`` with the judge beside the training worker (asleep while the trainer works,
woken and reloaded from its path after each push), in ``colocate_async`` beside it too (awake: generation overlaps
training), and in ``separate_async`` with the judge on a pool of its own. Each run also distils from a teacher
served on a pool of its own (the same model as the student; in ``colocate_async`` a LoRA student)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.cli_runs import Prepared, cli_run, needs
from tests.trainer.test_main_ppo import demo_model, make_gsm8k, quickstart

JUDGE = """
import json, time, urllib.request

def compute_score(data_source, solution_str, ground_truth, extra_info=None, reward_router_address=None,
                  reward_model_tokenizer=None):
    question = f"Answer: {solution_str}. Expected: {ground_truth}. Correct?"
    body = {"messages": [{"role": "user", "content": question}], "max_tokens": 4, "temperature": 0}
    request = urllib.request.Request(f"http://{reward_router_address}/v1/chat/completions",
                                     data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as reply:
        verdict = json.load(reply)["choices"][0]["message"]["content"]
    score = float(ground_truth in verdict or len(verdict) % 2 == 1)  # the judge's words decide
    with open(JUDGED, "a") as f:
        f.write(json.dumps({"verdict": verdict, "score": score, "at": time.time()}) + "\\n")
    return {"score": score, "verdict_length": len(verdict)}
"""


def judged_run(work: Path, *mode: str) -> Prepared:
    """GRPO on the tiny GSM8K copy, 2 steps, scored by the demo model served as a judge."""
    data, model = make_gsm8k(work), demo_model(work)
    judge = work / "judge.py"
    judge.write_text(f"JUDGED = {str(work / 'judged.jsonl')!r}\n" + JUDGE)
    # and on-policy distillation from the same model, served as the teacher on a pool of its own
    # (tests/experimental/teacher_loop has the teachers' numbers)
    teacher = [
        "distillation.enabled=true",
        "distillation.n_gpus_per_node=1",
        "distillation.nnodes=1",
        f"distillation.teacher_models.teacher_model.model_path={model}",
    ]
    overrides = quickstart(
        data,
        model,
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.rollout.n=2",
        "trainer.logger=[console,file]",
        f"reward.custom_reward_function.path={judge}",
        "reward.reward_manager.name=rate_limited",
        "+reward.max_concurrent=4",
        "+reward.max_rpm=6000",
        "reward.reward_model.enable=true",
        f"reward.reward_model.model_path={model}",
        "reward.reward_model.rollout.dtype=float32",
        "reward.reward_model.rollout.response_length=8",
        *teacher,
        *mode,
    )
    return overrides, {}


@cli_run("judge", cost_s=60)
def prepare_judge(work: Path) -> Prepared:
    """sync, the judge's replica beside the training worker."""
    return judged_run(work, "trainer.v1.trainer_mode=sync")


@cli_run("judge_colocate", cost_s=60)
def prepare_judge_colocate(work: Path) -> Prepared:
    """colocate_async, the judge's replica beside the training worker; a LoRA student (its adapters start at
    zero: the student starts as the teacher)."""
    return judged_run(
        work,
        "trainer.v1.trainer_mode=colocate_async",
        "actor_rollout_ref.model.lora_rank=8",
        "actor_rollout_ref.model.lora_alpha=16",
        "actor_rollout_ref.model.target_modules=[q_proj,v_proj]",
    )


@cli_run("judge_separate", cost_s=60)
def prepare_judge_separate(work: Path) -> Prepared:
    """separate_async (one rollout server on a pool of its own), the judge on a pool of its own too."""
    return judged_run(
        work,
        "trainer.v1.trainer_mode=separate_async",
        "actor_rollout_ref.rollout.nnodes=1",
        "actor_rollout_ref.rollout.n_gpus_per_node=1",
        "reward.reward_model.enable_resource_pool=true",
        "reward.reward_model.n_gpus_per_node=1",
        "reward.reward_model.nnodes=1",
    )


@needs("judge", "judge_colocate", "judge_separate")
def test_a_served_judge_scores_every_training_sample_through_the_router(cli_runs):
    for name in ("judge", "judge_colocate", "judge_separate"):
        code, output, records, work = cli_runs[name]
        assert code == 0, output[-3000:]
        assert "reaches the reward model at http://" in output and "1 replica(s) behind the router" in output
        judged = [json.loads(line) for line in (work / "judged.jsonl").read_text().splitlines()]
        assert len(judged) == 2 * 8 * 2 + 8, name  # 2 steps × 8 prompts × n=2 and the final validation's 8
        steps = [r["data"] for r in records if r["data"].get("training/global_step")]
        assert len(steps) == 2
        judged.sort(key=lambda j: j["at"])  # the training samples first, batch by batch
        for step, record in enumerate(steps):  # every sample's reward is the judge's, none lost to errors
            assert record["reward/error_count"] == 0 and record["reward/timeout_count"] == 0
            scores = [j["score"] for j in judged[step * 16 : (step + 1) * 16]]
            assert abs(record["critic/score/mean"] - sum(scores) / 16) < 1e-6, (name, step)
    # beside the trainer, the judge slept after each step's generation; it judged the next step and the validation
    # after the push woke it (the hf engine drops its weights on sleep: it reloaded them from its path)
    assert cli_runs["judge"].output.count("reward model replicas asleep") == 2
    for name in ("judge_colocate", "judge_separate"):  # generation overlaps training / a pool of its own: awake
        assert "reward model replicas asleep" not in cli_runs[name].output


@needs("judge", "judge_colocate", "judge_separate")
def test_every_mode_distils_from_a_teacher_served_on_its_own_pool(cli_runs):
    """The teacher is the student's starting point and the learning rate tiny: the two agree on every sampled
    token up to the training dtype (k3 ~1e-6; a teacher log-prob missing or misplaced would cost ~10 a token)."""
    for name in ("judge", "judge_colocate", "judge_separate"):
        code, output, records, _ = cli_runs[name]
        assert code == 0, output[-3000:]
        assert "teacher 'default':" in output, name
        steps = [r["data"] for r in records if r["data"].get("training/global_step")]
        losses = [s["actor/distillation/loss"] for s in steps]
        assert len(losses) == 2 and all(0 < loss < 1e-4 for loss in losses), (name, losses)
        assert steps[1]["actor/distillation/loss_max"] >= steps[1]["actor/distillation/loss_min"] >= 0
        # the LoRA student trains its adapters only (they alone are pushed to the engines)
        assert all(s["weight_sync/adapters_only"] == float(name == "judge_colocate") for s in steps), name
