"""``python -m verl.trainer.main_ppo`` end to end, as a user runs it (subprocesses, Ray, real workers, CPU).

Each run is declared once (``@cli_run``) and started by the session's scheduler (`tests/cli_runs.py`); the tests
only assert on the runs they name (``@needs``). One test runs the CLI itself (``cli``): the bad-config one, which
fails before Ray in a few seconds; the vLLM one runs in the other venv.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import pytest

from tests.cli_runs import (  # noqa: F401 - re-exported: other test modules import them from here
    POOL_TIMEOUT_S,
    TIMEOUT_S,
    MainRun,
    Prepared,
    cli_run,
    main_command,
    needs,
    read_records,
    run_main,
)
from tests.utils._real_run import STEPS as TRACKED_STEPS
from tests.utils._real_run import tracker_setup


# ------------------------------------------------------------------------------------------------------ the tests
def series(records: list, key: str) -> list[float]:
    return [r["data"][key] for r in records if key in r["data"]]


def assert_finite(data: dict, *keys: str) -> None:
    """Each key is logged as a finite float (the file logger writes NaN and inf as strings, which fail here)."""
    for key in keys:
        assert key in data, key
        value = data[key]
        assert isinstance(value, (int, float)) and not isinstance(value, bool), (key, value)
        assert math.isfinite(value), (key, value)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@cli_run("demo", cost_s=90)
def prepare_demo(work: Path) -> Prepared:
    """The demo as it ships: no override at all (40 steps, the longest run)."""
    return [], {}


@pytest.mark.slow
@needs("demo")
def test_demo_learns_out_of_the_box(cli_runs):
    code, output, records, _ = cli_runs["demo"]
    assert code == 0, output[-3000:]
    data_records = [r for r in records if r["data"]]
    scores = series(records, "critic/score/mean")
    assert len(scores) == 40
    first, last = sum(scores[:5]) / 5, sum(scores[-5:]) / 5
    assert last - first >= 0.2, scores
    assert "Training Progress" in output  # the tqdm bar
    for record in records:
        if not record["data"]:
            continue
        data = record["data"]
        assert_finite(data, "actor/pg_loss", "actor/grad_norm", "actor/entropy", "critic/advantages/mean")
        assert_finite(data, "timing_s/gen", "timing_s/update_actor", "timing_s/step", "perf/time_per_step")
        assert data["perf/throughput"] > 0 and data["timing_s/step"] >= data["timing_s/update_actor"] > 0
        assert 1 <= data["response_length/mean"] <= 8 and data["prompt_length/mean"] > 0  # 8 response tokens
        # sync: step k trains samples of weight version k - 1 (one push per step), from version k - 1: lag 0
        assert data["async/weight_version"] == record["step"] - 1
        assert data["async/staleness/mean"] == data["async/staleness/max"] == 0
    # a step with a sample of non-zero advantage moves the policy (a norm of 0 there would be a lost gradient)
    steps = [(r["data"]["actor/grad_norm"], r["data"].get("actor/zero_adv_skip_frac", 0.0)) for r in data_records]
    assert all(norm > 0 for norm, skipped in steps if skipped < 1), steps
    assert sum(norm > 0 for norm, _ in steps) >= len(steps) // 2, steps


KEEP_ZERO_ADV = "actor_rollout_ref.actor.skip_zero_advantage_samples=false"
ROOT = Path(__file__).resolve().parents[2]


@cli_run("demo_old_log_prob_pass", cost_s=40)
def prepare_demo_old_log_prob_pass(work: Path) -> Prepared:
    """The demo's first 4 steps with the old-log-prob pass run on its own, every sample through the gradient pass,
    validating at step 4 as ``demo_zero_adv_kept`` does."""
    return [
        "trainer.total_training_steps=4",
        "actor_rollout_ref.actor.skip_on_policy_old_log_prob=false",
        KEEP_ZERO_ADV,
        f"trainer.test_freq={TRACKED_STEPS}",
    ], {}


@cli_run("demo_zero_adv_kept", cost_s=45)
def prepare_demo_zero_adv_kept(work: Path) -> Prepared:
    """The demo's first 4 steps with every sample through the gradient pass (the demo skips zero-advantage ones),
    and every tracker on (``tests/utils/_real_run.py``: the trackers' tests read this run too)."""
    overrides, env = tracker_setup(work)
    return ["trainer.total_training_steps=4", KEEP_ZERO_ADV, *overrides], env


def data_records(run: MainRun) -> list[dict]:
    return [r for r in run.records if r.get("data")]


@pytest.mark.slow
@needs("demo_zero_adv_kept", "demo_old_log_prob_pass")
def test_old_log_probs_from_the_update_are_bit_identical_to_their_own_pass(cli_runs):
    from tests.trainer.test_checkpoint_resume import comparable  # (that module imports this one)

    skipped, separate = cli_runs["demo_zero_adv_kept"], cli_runs["demo_old_log_prob_pass"]
    assert separate.returncode == 0, separate.output[-3000:]
    assert "old log-probs: from the update's forward" in skipped.output
    assert "old log-probs: actor.skip_on_policy_old_log_prob=false" in separate.output
    steps = data_records(separate)
    assert len(steps) == 4 and all("timing_s/old_log_prob" in r["data"] for r in steps)
    demo = data_records(skipped)
    assert not any("timing_s/old_log_prob" in r["data"] for r in demo)  # the pass really was skipped
    assert {"actor/entropy", "actor/ppo_kl", "training/rollout_probs_diff_max"} <= set(demo[0]["data"])
    for step, (a, b) in enumerate(zip(demo, steps, strict=True), start=1):
        assert comparable(a) == comparable(b), f"step {step}"  # exactly: every metric but wall-clock ones


@pytest.mark.slow
@needs("demo", "demo_zero_adv_kept")
def test_skipping_zero_advantage_samples_keeps_the_first_update(cli_runs):
    """Step 1 (same weights, same samples): the loss bit for bit, the gradient norm and every other metric within
    float-sum order; later steps start from weights that differ in the last bits, so they are not compared."""
    from tests.trainer.test_checkpoint_resume import comparable

    demo, kept = cli_runs["demo"], cli_runs["demo_zero_adv_kept"]
    assert "zero-advantage samples: skipped in the update" in demo.output
    assert "zero-advantage samples: kept (actor.skip_zero_advantage_samples=false)" in kept.output
    a, b = data_records(demo)[0]["data"], data_records(kept)[0]["data"]
    assert 0 < a["actor/zero_adv_skip_frac"] < 1 and "actor/zero_adv_skip_frac" not in b
    assert a["actor/pg_loss"] == b["actor/pg_loss"]
    assert a["actor/grad_norm"] == pytest.approx(b["actor/grad_norm"], rel=1e-6)
    skipping, keeping = comparable({"data": a}), comparable({"data": b})
    skipping.pop("actor/zero_adv_skip_frac")
    assert skipping.keys() == keeping.keys()
    for key, value in skipping.items():
        expected = keeping[key]
        assert value == (pytest.approx(expected, rel=1e-5, abs=1e-7) if isinstance(value, float) else expected), key


HOOKS_LIB = '''
"""A trainer mode of a user's own (trainer.v1.trainer_mode=hooked_sync): each of veRL's hooks logs itself."""
import os

from verl.trainer.ppo.v1 import HOOKS, PPOTrainer, register_trainer


def _logged(name):
    def hook(self):
        with open(os.environ["HOOKS_LOG"], "a") as f:
            f.write(f"{name} {self.global_steps}\\n")
        return {"hooks/prepared_at": float(self.global_steps)} if name == "prepare_step" else None

    return hook


@register_trainer("hooked_sync")
class HookedTrainer(PPOTrainer):
    rollout_mode = "sync"


for _name in HOOKS:
    setattr(HookedTrainer, _name, _logged(_name))
'''


@cli_run("validation", cost_s=45, own_cluster="asserts the thread count run_ppo picks for a cluster of its own")
def prepare_validation(work: Path) -> Prepared:
    """Validation before training and at the last step, 4 samples at temperature 1, with the dumps; the trainer is
    a mode of the user's own, registered by an external lib, whose hooks log themselves."""
    (work / "hooks_lib.py").write_text(HOOKS_LIB)
    env = {
        "OMP_NUM_THREADS": None,  # the suite sets it (conftest): this run shows the default
        "HOOKS_LOG": str(work / "hooks.log"),
        "PYTHONPATH": os.pathsep.join([str(work), str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    return [
        "actor_rollout_ref.model.external_lib=hooks_lib",
        "trainer.v1.trainer_mode=hooked_sync",
        "trainer.total_training_steps=2",
        "trainer.val_before_train=true",
        "trainer.test_freq=2",
        "data.val_max_samples=12",
        "actor_rollout_ref.rollout.val_kwargs.n=4",
        "actor_rollout_ref.rollout.val_kwargs.do_sample=true",
        "actor_rollout_ref.rollout.val_kwargs.temperature=1.0",
        "trainer.log_val_generations=3",
        f"trainer.rollout_data_dir={work / 'rollouts'}",
        f"trainer.validation_data_dir={work / 'val'}",
    ], env


@needs("validation")
def test_validation_metrics_generations_and_dumps(cli_runs):
    from verl.trainer.ppo.validation import validation_metrics

    code, output, records, work = cli_runs["validation"]
    assert code == 0, output[-3000:]
    # OMP_NUM_THREADS unset: the one training worker computes on every core (Ray alone would give it one thread)
    assert f"1 computing process(es) on {os.cpu_count()} cores: OMP_NUM_THREADS={os.cpu_count()} each" in output
    by_step = {r["step"]: r["data"] for r in records if r.get("data")}
    prefix = "verl/arithmetic"
    for step in (0, 2):  # before training, and at the last step (test_freq)
        data = by_step[step]
        assert sorted(k for k in data if k.startswith("val-core/")) == [
            f"val-core/{prefix}/acc/best@4/mean",
            f"val-core/{prefix}/acc/maj@4/mean",
            f"val-core/{prefix}/acc/mean@4",
        ]
        for name in ("reward/mean@4", "acc/std@4", "acc/best@2/mean", "acc/worst@4/mean", "stop/mean@4"):
            assert f"val-aux/{prefix}/{name}" in data, name
        # the dump holds every sample; the metrics recomputed from it are the logged ones
        rows = read_jsonl(work / "val" / f"{step}.jsonl")
        assert len(rows) == 12 * 4 and {"input", "output", "gts", "score", "acc", "pred", "step"} <= set(rows[0])
        uids = [f"p{i // 4}" for i in range(len(rows))]  # samples of a prompt are adjacent
        assert len({rows[i]["input"] for i in range(0, 4)}) == 1
        infos = {key: [r[key] for r in rows] for key in ("acc", "pred", "stop")}
        infos["reward"] = [r["score"] for r in rows]
        expected = validation_metrics([prefix] * len(rows), uids, infos)
        for key, value in expected.items():
            assert data[key] == pytest.approx(value, abs=1e-9), key
    # sampling with temperature 1: a prompt's 4 answers are not all the same
    rows = read_jsonl(work / "val" / "0.jsonl")
    assert any(len({rows[i + j]["output"] for j in range(4)}) > 1 for i in range(0, len(rows), 4))
    for step in (1, 2):  # the training rollouts, with the reward's extra info
        rows = read_jsonl(work / "rollouts" / f"{step}.jsonl")
        assert len(rows) == 16 * 4 and "acc" in rows[0] and rows[0]["step"] == step
        assert sum(r["score"] for r in rows) / len(rows) == pytest.approx(by_step[step]["critic/score/mean"], abs=1e-5)
        assert "timing_s/dump_rollout_generations" in by_step[step]


@needs("validation")
def test_a_registered_trainer_mode_runs_with_veRLs_hooks_in_order(cli_runs):
    code, output, records, work = cli_runs["validation"]
    assert code == 0, output[-3000:]
    events = (work / "hooks.log").read_text().split("\n")[:-1]
    step = ["on_step_begin", "prepare_step", "on_sample_begin", "on_sample_end"]
    validate = ["on_validate_begin", "on_validate_end"]
    expected = ["on_init_end", "on_train_begin", *validate]
    expected = [f"{e} 0" for e in expected]
    expected += [f"{e} 1" for e in [*step, "on_step_end"]]
    expected += [f"{e} 2" for e in [*step, *validate, "on_step_end", "on_train_end"]]
    assert events == expected
    steps = {r["step"]: r["data"] for r in records if r.get("data") and "hooks/prepared_at" in r["data"]}
    assert {s: d["hooks/prepared_at"] for s, d in steps.items()} == {1: 1.0, 2: 2.0}  # prepare_step's metrics


@cli_run("val_only", cost_s=35)
def prepare_val_only(work: Path) -> Prepared:
    """Validation only, of 5 prompts over 2 workers."""
    return [
        "trainer.val_only=true",
        "trainer.val_before_train=false",
        "trainer.n_gpus_per_node=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32",
        "data.val_max_samples=5",
        f"trainer.validation_data_dir={work / 'val'}",
    ], {}


@needs("val_only")
def test_val_only_with_a_validation_set_that_does_not_divide_over_the_workers(cli_runs):
    code, output, records, work = cli_runs["val_only"]
    assert code == 0, output[-3000:]
    assert [r["step"] for r in records if r.get("data")] == [0]  # validated, never trained
    data = records[-1]["data"]
    assert "val-core/verl/arithmetic/acc/mean@1" in data and "training/global_step" not in data
    rows = read_jsonl(work / "val" / "0.jsonl")
    assert len(rows) == 5 and len({r["input"] for r in rows}) == 5  # padding rows were dropped


@cli_run("remax", cost_s=40)
def prepare_remax(work: Path) -> Prepared:
    """ReMax with PF-PPO, and a chat template of our own."""
    template = "{% for m in messages %}Q: {{ m.content }} {% endfor %}A:"
    return [
        "algorithm.adv_estimator=remax",
        "algorithm.use_pf_ppo=true",
        "trainer.total_training_steps=2",
        f"actor_rollout_ref.model.custom_chat_template='{template}'",
        f"trainer.rollout_data_dir={work / 'rollouts'}",
    ], {}


@needs("remax")
def test_remax_baseline_pf_ppo_and_a_custom_chat_template(cli_runs):
    code, output, records, work = cli_runs["remax"]
    assert code == 0, output[-3000:]
    data = records[-1]["data"]
    assert data["timing_s/gen_max"] > 0 and data["timing_s/generate_sequences"] > 0
    rows = read_jsonl(work / "rollouts" / "2.jsonl")
    assert all(r["input"].startswith("Q: What is") and r["input"].endswith("A:") for r in rows)
    # PF-PPO resampled the 64 samples with replacement: a prompt no longer appears a multiple of n=4 times
    counts = Counter(r["input"] for r in rows)
    assert len(rows) == 64 and any(c % 4 for c in counts.values())


@cli_run("dapo", cost_s=45)
def prepare_dapo(work: Path) -> Prepared:
    """DAPO's dynamic sampling (filter_groups) and clip-higher, written as a veRL 0.10 script: the V1 trainer's
    keys and the reward settings under ``reward.*`` (the dapo manager with its overlong buffer)."""
    return [
        "trainer.use_v1=true",
        "trainer.v1.trainer_mode=sync",
        "ray_kwargs.ray_init.runtime_env.py_executable=null",  # every veRL 0.10 example script passes it
        "reward.reward_manager.name=dapo",
        "+reward.reward_kwargs.overlong_buffer_cfg={enable: true, len: 4, penalty_factor: 0.5, log: true}",
        "trainer.total_training_steps=2",
        "algorithm.filter_groups={enable: true, metric: seq_reward, max_num_gen_batches: 8}",
        "actor_rollout_ref.actor.clip_ratio_high=0.28",
        f"trainer.rollout_data_dir={work / 'rollouts'}",
    ], {}


DAPO_BUFFER = [
    "trainer.v1.trainer_mode=sync",
    "trainer.v1.sampler.schedule=replay_buffer",
    "trainer.total_training_steps=2",
    "algorithm.filter_groups={enable: true, metric: seq_reward, max_inflight_gen_batches: 1}",
    "trainer.save_freq=1",  # test_checkpoint_resume resumes step 1's checkpoint
]


@cli_run("dapo_buffer", cost_s=45)
def prepare_dapo_buffer(work: Path) -> Prepared:
    """The DAPO run under veRL 0.10's replay-buffer schedule: flat groups evicted, two prompts refilled for each."""
    return [*DAPO_BUFFER, f"trainer.rollout_data_dir={work / 'rollouts'}"], {}


@needs("dapo_buffer")
def test_dapo_under_the_replay_buffer_refills_what_it_evicts(cli_runs):
    code, output, records, work = cli_runs["dapo_buffer"]
    assert code == 0, output[-3000:]
    steps = [r["data"] for r in records if r["data"]]
    assert len(steps) == 2
    # each generation batch logs "generated k prompts (t this step)": 16, then refills of at most 16 (one training
    # batch in flight) spending a credit of 2 per evicted group
    batches: list[list[int]] = []
    for k, t in re.findall(r"replay buffer: generated (\d+) prompts \((\d+) this step\)", output):
        if k == t:  # a step's first batch
            batches.append([])
        batches[-1].append(int(k))
    assert len(batches) == 2 and all(b[0] == 16 and max(b) <= 16 for b in batches)
    for s, sizes in zip(steps, batches, strict=True):
        evicted = s["training/filter_groups/evicted_samples"]
        surplus = s["training/filter_groups/discarded_surplus_samples"]
        assert s["train/num_gen_batches"] == len(sizes) and evicted + 16 + surplus == sum(sizes)
        assert sum(sizes) - 16 <= 2 * evicted
    for step in (1, 2):
        rows = read_jsonl(work / "rollouts" / f"{step}.jsonl")
        assert len(rows) == 16 * 4
        by_prompt: dict[str, list[float]] = {}
        for r in rows:
            by_prompt.setdefault(r["input"], []).append(r["score"])
        assert all(len(set(scores)) > 1 for scores in by_prompt.values())


@needs("dapo")
def test_dapo_dynamic_sampling_trains_on_informative_groups_only(cli_runs):
    code, output, records, work = cli_runs["dapo"]
    assert code == 0, output[-3000:]
    steps = [r["data"] for r in records if r["data"]]
    assert len(steps) == 2 and all(1 <= s["train/num_gen_batches"] <= 8 for s in steps)
    # veRL 0.10's names: prompt groups dropped (16 per generation batch, minus the kept), the kept beyond 16
    for s in steps:
        evicted, surplus = (
            s["training/filter_groups/evicted_samples"],
            s["training/filter_groups/discarded_surplus_samples"],
        )
        assert evicted + 16 + surplus == 16 * s["train/num_gen_batches"] and surplus >= 0
        assert "training/filter_groups/filtered_reward_counts" not in s  # a wandb table, not a scalar metric
    for step in (1, 2):
        rows = read_jsonl(work / "rollouts" / f"{step}.jsonl")
        assert len(rows) == 16 * 4  # a full training batch, whatever the number of generation batches
        by_prompt: dict[str, list[float]] = {}
        for r in rows:
            by_prompt.setdefault(r["input"], []).append(r["score"])
        assert all(len(set(scores)) > 1 for scores in by_prompt.values())  # no group with one score survived
        # reward.*: the dapo manager with its overlong buffer (len 4 of 8 tokens, factor 0.5, log: true) scored
        assert all(-0.5 <= r["overlong_reward"] <= 0 and r["overlong"] == (r["overlong_reward"] < 0) for r in rows)
        assert any(r["overlong"] for r in rows) and any(r["overlong_reward"] == -0.5 for r in rows)
    assert "older name" not in output  # a veRL 0.10 script: nothing to read from older names


@cli_run("optimal_token_baseline", cost_s=40)
def prepare_optimal_token_baseline(work: Path) -> Prepared:
    """A bf16 rollout against the fp32 trainer: a real mismatch for the IS weights and the rejection to act on; the
    optimal-token baseline reads the old-log-prob pass's Σπ² and the IS weights."""
    return [
        "trainer.total_training_steps=2",
        "algorithm.adv_estimator=optimal_token_baseline",
        "actor_rollout_ref.actor.calculate_sum_pi_squared=true",
        "actor_rollout_ref.rollout.dtype=bfloat16",
        "algorithm.rollout_correction.rollout_is=token",
        "algorithm.rollout_correction.rollout_rs=token_k2",
        "algorithm.rollout_correction.rollout_rs_threshold=1e-5",
    ], {}


@cli_run("bypass", cost_s=35)
def prepare_bypass(work: Path) -> Prepared:
    """Rollout correction in bypass mode: the rollout's log-probs as the old policy's, with REINFORCE."""
    return [
        "trainer.total_training_steps=2",
        "algorithm.rollout_correction.bypass_mode=true",
        "algorithm.rollout_correction.rollout_is=token",
        "algorithm.rollout_correction.loss_type=reinforce",
    ], {}


@needs("optimal_token_baseline", "bypass")
def test_rollout_correction_bypass_mode_and_the_optimal_token_baseline(cli_runs):
    code, output, records, _ = cli_runs["optimal_token_baseline"]
    assert code == 0, output[-3000:]
    data = records[-1]["data"]
    assert abs(data["rollout_corr/rollout_is_mean"] - 1.0) < 0.1 and data["rollout_corr/rollout_is_max"] <= 2.0
    assert 0.0 < data["rollout_corr/rollout_rs_masked_fraction"] < 1.0  # some tokens left the loss, not all
    assert data["timing_s/old_log_prob"] > 0
    advantages = [data[f"critic/advantages/{stat}"] for stat in ("mean", "max", "min")]
    assert all(math.isfinite(a) for a in advantages) and advantages[1] > advantages[2]

    code, output, records, _ = cli_runs["bypass"]
    assert code == 0, output[-3000:]
    data = records[-1]["data"]
    assert "timing_s/old_log_prob" not in data  # the rollout's log-probs stood in for the old-policy pass
    assert_finite(data, "rollout_corr/rollout_is_mean", "actor/pg_loss", "actor/grad_norm")
    assert 0.0 < data["rollout_corr/rollout_is_mean"] <= 2.0 and data["actor/grad_norm"] > 0


def test_bad_config_fails_before_ray_naming_every_problem(tmp_path, cli):
    code, output, _ = cli(tmp_path, "trainer.mode=fast", "actor_rollout_ref.actor.clip_ratio=-1")
    assert code != 0
    assert "2 problem(s) in the config" in output and "trainer.v1.trainer_mode='fast'; use one of" in output
    assert "Started a local Ray instance" not in output


_gsm8k_lock = threading.Lock()


def make_gsm8k(tmp_path: Path) -> Path:
    """A tiny local GSM8K copy (public jsonl layout) converted by the example script, as a user would; converted
    once per session (beside the runs' folders) and reused."""
    out = tmp_path.parent / "gsm8k"
    with _gsm8k_lock:
        if (out / "train.parquet").exists():
            return out
        raw = tmp_path.parent / "gsm8k_raw"
        raw.mkdir(exist_ok=True)
        for split, count in (("train", 16), ("test", 8)):
            rows = [
                {
                    "question": f"Tom has {i} apples and buys {i + 2}. How many?",
                    "answer": f"{i}+{i + 2}\n#### {2 * i + 2}",
                }
                for i in range(count)
            ]
            (raw / f"{split}.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
        root = Path(__file__).resolve().parents[2]
        script = [sys.executable, str(root / "examples/data_preprocess/gsm8k.py")]
        subprocess.run(
            [*script, "--local_dataset_path", str(raw), "--local_save_dir", str(out)],
            check=True,
            capture_output=True,
            timeout=120,
        )
    return out


def demo_model(tmp_path: Path) -> str:
    """The demo model's folder in the cache the runs share (built there once per session)."""
    from verl.utils.demo import ensure_demo_assets

    return str(ensure_demo_assets(tmp_path.parent / "verl_cache").model_path)


def quickstart(data: Path, model: str, *extra: str) -> list[str]:
    """veRL's quickstart command line, pointed at local tiny files and small sizes."""
    return [
        f"data.train_files={data}/train.parquet",
        f"data.val_files={data}/test.parquet",
        "data.train_batch_size=8",
        "data.max_prompt_length=128",
        "data.max_response_length=16",
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.4",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
        "critic.optim.lr=1e-5",
        f"critic.model.path={model}",
        "critic.ppo_micro_batch_size_per_gpu=4",
        "algorithm.kl_ctrl.kl_coef=0.001",
        "trainer.logger=console",
        "trainer.val_before_train=False",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        "trainer.save_freq=10",
        "trainer.test_freq=10",
        "trainer.total_epochs=15",
        "trainer.total_training_steps=2",
        *extra,
    ]


CURRICULUM_SAMPLER = """
import os

from verl.experimental.dataset.sampler import AbstractCurriculumSampler


class ScoreCurriculum(AbstractCurriculumSampler):
    def __init__(self, data_source, data_config):
        self.size = len(data_source)

    def __iter__(self):
        return iter(range(self.size))

    def __len__(self):
        return self.size

    def update(self, batch):
        with open(os.environ["CURRICULUM_LOG"], "a") as f:
            f.write(f"{len(batch)} {float(batch.batch['token_level_scores'].sum(-1).mean())}\\n")
"""


@cli_run("quickstart", cost_s=50)
def prepare_quickstart(work: Path) -> Prepared:
    """veRL's quickstart on a tiny GSM8K copy, with a curriculum sampler that logs its updates."""
    data, model = make_gsm8k(work), demo_model(work)
    (work / "curriculum.py").write_text(CURRICULUM_SAMPLER)
    sampler = [f"data.sampler.class_path={work / 'curriculum.py'}", "data.sampler.class_name=ScoreCurriculum"]
    overrides = quickstart(data, model, "trainer.logger=[console,file]", "data.dataloader_num_workers=0", *sampler)
    return overrides, {"CURRICULUM_LOG": str(work / "curriculum.log")}


@needs("quickstart")
def test_verl_quickstart_command_runs_on_local_tiny_files(cli_runs):
    code, output, records, work = cli_runs["quickstart"]
    log = work / "curriculum.log"
    assert code == 0, output[-3000:]
    last = records[-1]["data"]
    assert_finite(last, "val-core/openai/gsm8k/acc/mean@1", "critic/vf_loss", "critic/values/mean", "actor/pg_loss")
    assert 0.0 <= last["val-core/openai/gsm8k/acc/mean@1"] <= 1.0  # gsm8k's scorer gives 0 or 1 per sample
    assert last["critic/vf_loss"] > 0 and last["critic/advantages/mean"] == pytest.approx(0.0, abs=1e-5)  # whitened
    assert (work / "ckpt" / "global_step_2" / "actor").is_dir()  # save at the last step
    # veRL's curriculum hook: update(batch) after each trained step, with that step's scored batch
    assert [line.split()[0] for line in log.read_text().splitlines()] == ["8", "8"]


@cli_run("malformed_row", cost_s=25)
def prepare_malformed_row(work: Path) -> Prepared:
    """The quickstart with a training file whose row 3 has no messages."""
    import pandas as pd

    data, model = make_gsm8k(work), demo_model(work)
    bad = pd.read_parquet(data / "train.parquet")
    bad.at[3, "prompt"] = []  # no messages at all
    bad.to_parquet(work / "bad.parquet")
    return quickstart(data, model, f"data.train_files={work / 'bad.parquet'}"), {}


@cli_run("raising_reward", cost_s=30)
def prepare_raising_reward(work: Path) -> Prepared:
    """The quickstart (GRPO) with a reward function that raises on every sample."""
    data, model = make_gsm8k(work), demo_model(work)
    reward = work / "reward.py"
    reward.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    raise RuntimeError('broken reward')\n"
    )
    overrides = quickstart(
        data,
        model,
        f"custom_reward_function.path={reward}",
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.rollout.n=2",
        "trainer.logger=[console,file]",
    )
    return overrides, {}


@needs("malformed_row", "raising_reward")
def test_malformed_row_and_raising_reward_function(cli_runs):
    code, output, _, _ = cli_runs["malformed_row"]
    assert code != 0 and "bad.parquet" in output and "row 3" in output and "prompt" in output

    code, output, records, work = cli_runs["raising_reward"]
    reward = work / "reward.py"
    # a reward function that fails on every sample stops the run, naming itself, its file and the exception
    assert code != 0 and not [r for r in records if r["data"]], output[-3000:]
    assert f"compute_score ({reward})" in output and "RuntimeError: broken reward" in output


@pytest.mark.vllm
def test_vllm_engine_end_to_end(tmp_path, cli):
    pytest.importorskip("vllm", reason="runs in the vllm venv")
    code, output, records = cli(
        tmp_path,
        "actor_rollout_ref.rollout.name=vllm",
        "trainer.total_training_steps=2",
        "actor_rollout_ref.rollout.load_format=dummy",
        "trainer.val_before_train=true",
        "data.val_max_samples=8",
    )
    assert code == 0, output[-3000:]
    logged = [r["data"] for r in records if r["data"]]
    assert len(logged) == 3 and "timing_s/gen" in logged[-1]
    # training and validation generated through the AgentLoop, on vLLM's engines
    assert any(key.startswith("val-core/") for key in logged[0])
    assert logged[-1]["agent_loop/generate_sequences/max"] > 0 and logged[-1]["num_turns/mean"] == 2
    assert records[-1]["data"]["training/rollout_probs_diff_max"] < 1e-3  # trainer and engine agree
