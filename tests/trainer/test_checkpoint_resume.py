"""Resume is a contract: runs of ``python -m verl.trainer.main_ppo`` (subprocesses, Ray, 2 gloo workers, the hf
engine, CPU) that are killed and resumed log the same per-step metrics as an uninterrupted run; faults leave the
last checkpoint loadable and are reported by name."""

from __future__ import annotations

import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.cli_runs import Prepared, cli_run, in_subprocess, needs
from tests.trainer.async_runs import placed
from tests.trainer.test_main_ppo import DAPO_BUFFER, quickstart, read_jsonl

# 48 prompts of 16: 3 steps per epoch, so 4 steps cross an epoch boundary; 2 worker processes. PPO with a critic
# (GAE) and a KL loss (so the reference policy runs too): every engine's state (actor, critic, optimizers, RNGs)
# must resume exactly. The critic fits each batch 4 times at lr 1e-4: its loss falls over the 4 steps.
COMMON = (
    "trainer.n_gpus_per_node=2",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32",
    "algorithm.adv_estimator=gae",
    "critic.ppo_micro_batch_size_per_gpu=32",
    "critic.model.fsdp_config.dtype=float32",
    "critic.optim.lr=1e-4",
    "critic.ppo_epochs=4",
    "actor_rollout_ref.actor.use_kl_loss=true",
    "data.train_max_samples=48",
    "trainer.total_epochs=3",
    "trainer.total_training_steps=4",
    "trainer.save_freq=1",
)
# what may differ between two runs of the same steps: wall-clock figures (timings, the async modes' idle shares),
# and the agent loops' per-sample timings (which sample is the slowest depends on timing too)
NOT_COMPARED = (
    "timing",
    "time",
    "throughput",
    "memory",
    "seconds",
    "agent_loop/generate_sequences",
    "agent_loop/tool_calls",
    "agent_loop/slowest",
    "idle_ratio",
)
# present, finite floats at every step of a PPO run with a critic and a KL loss
FINITE = (
    "actor/pg_loss",
    "actor/kl_loss",
    "actor/entropy",
    "actor/grad_norm",
    "critic/vf_loss",
    "critic/vf_clipfrac",
    "critic/values/mean",
    "critic/vf_explained_var",
    "critic/grad_norm",
    "critic/advantages/mean",
    "critic/returns/mean",
)


def comparable(record: dict) -> dict:
    return {k: v for k, v in record["data"].items() if not any(word in k for word in NOT_COMPARED)}


def steps(records: list[dict]) -> dict[int, dict]:
    return {r["step"]: comparable(r) for r in records if r["data"]}


def assert_same_steps(resumed: dict[int, dict], straight: dict[int, dict]) -> None:
    assert resumed, "no steps logged"
    for step, metrics in resumed.items():
        reference = straight[step]
        assert metrics.keys() == reference.keys(), step
        for key, value in metrics.items():
            assert value == reference[key], f"step {step}: {key} = {value!r} resumed, {reference[key]!r} straight"


@cli_run("resume_straight", cost_s=90)
def _straight(work: Path) -> Prepared:
    """4 steps without interruption, a checkpoint after each (with HF weights)."""
    hf = "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]"
    return Prepared([*COMMON, f"trainer.rollout_data_dir={work / 'rollouts'}", hf], {})


def kill_a_worker_after_step_2(work: Path, timeout_s: float = 600) -> None:
    """Once step 2's checkpoint of the run in ``work`` is the latest, SIGKILL its training worker of rank 0 (its pid
    from the trainer's ``placement:`` log line); write the moment (``time.monotonic()``) to ``work / "killed_at"``."""
    tracker, log = work / "ckpt" / "latest_checkpointed_iteration.txt", work / "output.log"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if tracker.exists() and tracker.read_text().strip() == "2" and log.exists():
            workers = {pid for (_, rank), (_, pid) in placed(log.read_text(errors="replace")).items() if rank == 0}
            if len(workers) == 1:  # actor and critic share the fused worker process of rank 0
                os.kill(workers.pop(), signal.SIGKILL)
                (work / "killed_at").write_text(repr(time.monotonic()))
                return
        time.sleep(0.05)


@cli_run("resume_killed", cost_s=70)
def _killed(work: Path) -> Prepared:
    """As the straight run; a training worker dies in the middle of step 3."""
    threading.Thread(target=kill_a_worker_after_step_2, args=(work,), daemon=True).start()
    return Prepared(list(COMMON), {})


@cli_run("resume_after_kill", cost_s=60, after=("resume_killed",))
def _resumed_after_kill(work: Path, deps: dict) -> Prepared:
    """The killed run again, in its folder (``trainer.resume_mode=auto``), keeping two checkpoints."""
    ckpt = deps["resume_killed"].work / "ckpt"
    keep_two = ("trainer.max_actor_ckpt_to_keep=2", "trainer.max_critic_ckpt_to_keep=2")
    return Prepared([*COMMON, *keep_two, f"trainer.default_local_dir={ckpt}"], {})


@cli_run("resume_epoch", cost_s=50, after=("resume_straight",))
def _resume_at_the_epoch_boundary(work: Path, deps: dict) -> Prepared:
    folder = deps["resume_straight"].work / "ckpt" / "global_step_3"  # the last step of epoch 0
    resume = ("trainer.resume_mode=resume_path", f"trainer.resume_from_path={folder}")
    return Prepared([*COMMON, *resume, f"trainer.rollout_data_dir={work / 'rollouts'}"], {})


@cli_run("resume_broken", cost_s=35, after=("resume_straight",))
def _broken_checkpoint(work: Path, deps: dict) -> Prepared:
    """Step 4's checkpoint with a missing shard."""
    broken = work / "broken" / "global_step_4"
    shutil.copytree(deps["resume_straight"].work / "ckpt" / "global_step_4", broken)
    (broken / "actor" / "__1_0.distcp").unlink()
    return Prepared([*COMMON, "trainer.resume_mode=resume_path", f"trainer.resume_from_path={broken}"], {})


@cli_run("resume_other_model", cost_s=35, after=("resume_straight",))
def _another_model(work: Path, deps: dict) -> Prepared:
    """Step 4's checkpoint resumed with another (narrower) model."""
    from verl.utils.demo import ensure_demo_assets

    assets = ensure_demo_assets(work.parent / "verl_cache")
    other = work / "other_model"
    build = (
        "import sys; from transformers import AutoConfig, AutoModelForCausalLM\n"
        "config = AutoConfig.from_pretrained(sys.argv[1]); config.hidden_size, config.intermediate_size = 64, 128\n"
        "AutoModelForCausalLM.from_config(config).save_pretrained(sys.argv[2])"
    )
    in_subprocess(build, assets.model_path, other)
    for file in Path(assets.model_path).iterdir():
        if file.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(file, other / file.name)
    source = deps["resume_straight"].work / "ckpt" / "global_step_4"
    overrides = quickstart(Path(assets.train_files).parent, str(other), "algorithm.adv_estimator=grpo")
    resume = ["trainer.resume_mode=resume_path", f"trainer.resume_from_path={source}"]
    return Prepared([*overrides, "actor_rollout_ref.rollout.n=2", *resume, "trainer.logger=[console,file]"], {})


@pytest.fixture
def straight(cli_runs) -> tuple[Path, dict[int, dict]]:
    run = cli_runs["resume_straight"]
    assert run.returncode == 0, run.output[-3000:]
    return run.work, steps(run.records)


@needs("resume_straight", "resume_killed", "resume_after_kill")
def test_a_killed_worker_stops_the_run_and_the_resumed_run_matches(straight, cli_runs):
    straight_dir, reference = straight
    killed = cli_runs["resume_killed"]
    output = killed.output
    assert killed.returncode != 0 and (killed.work / "killed_at").exists(), output[-3000:]
    assert sorted(steps(killed.records)) == [1, 2], output[-3000:]  # the kill landed in step 3, mid-run
    stopped_after = cli_runs.ended["resume_killed"] - float((killed.work / "killed_at").read_text())
    assert stopped_after < 120  # the driver noticed and stopped, no hang
    assert "died while running" in output and "actor_rollout" in output and "in stage" in output, output[-3000:]

    # resume (trainer.resume_mode=auto): from step 2, through the epoch boundary after step 3, to step 4
    code, output, records, _ = cli_runs["resume_after_kill"]
    assert code == 0, output[-3000:]
    assert "resumed from" in output and "global_step_2" in output
    resumed = steps(records)
    assert sorted(resumed) == [3, 4] and resumed[4]["training/epoch"] == 1
    assert_same_steps(resumed, reference)
    assert_same_steps(steps(killed.records), reference)
    # rotation kept the newest two, and the tracker points at the last
    ckpt = killed.work / "ckpt"
    assert sorted(p.name for p in ckpt.iterdir() if p.name.startswith("global_step_")) == [
        "global_step_3",
        "global_step_4",
    ]
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "4"
    # the trainer state written at the end is the uninterrupted run's (random states aside: pickled generators)
    from verl.utils.checkpoint.checkpoint_manager import TRAINER_STATE_FILE, load_state_file

    ours = load_state_file(str(ckpt / "global_step_4" / TRAINER_STATE_FILE))
    theirs = load_state_file(str(straight_dir / "ckpt" / "global_step_4" / TRAINER_STATE_FILE))
    keys = ("global_steps", "epoch", "weight_version", "kl_coef", "source", "roles")
    assert {k: ours[k] for k in keys} == {k: theirs[k] for k in keys}
    assert (ours["global_steps"], ours["epoch"], ours["weight_version"]) == (4, 1, 4)  # one weight push per step


@needs("resume_straight", "resume_epoch")
def test_resume_from_an_epoch_boundary_neither_skips_nor_repeats(straight, cli_runs):
    straight_dir, reference = straight
    code, output, records, work = cli_runs["resume_epoch"]
    assert code == 0, output[-3000:]
    resumed = steps(records)
    assert sorted(resumed) == [4] and resumed[4]["training/epoch"] == 1
    assert_same_steps(resumed, reference)
    # the same prompts, in the same order, as the uninterrupted run's first batch of epoch 1
    ours = [r["input"] for r in read_jsonl(work / "rollouts" / "4.jsonl")]
    theirs = [r["input"] for r in read_jsonl(straight_dir / "rollouts" / "4.jsonl")]
    assert ours == theirs


@needs("resume_straight")
def test_gae_with_a_kl_loss_trains_its_critic_and_moves_away_from_the_reference(straight):
    records = straight[1]
    assert sorted(records) == [1, 2, 3, 4]
    series = {key: [records[step][key] for step in (1, 2, 3, 4)] for key in FINITE}
    for key, values in series.items():  # the file logger writes NaN as the string "nan": floats, and finite
        assert all(isinstance(v, float) and math.isfinite(v) for v in values), (key, values)
    vf_loss = series["critic/vf_loss"]
    assert all(v > 0 for v in vf_loss), vf_loss  # half a squared error
    assert max(vf_loss[2:]) < vf_loss[0], vf_loss  # the critic learns the returns (measured: 0.024 -> 0.005, 0.009)
    kl_loss = series["actor/kl_loss"]
    assert kl_loss[0] == pytest.approx(0.0, abs=1e-7), kl_loss  # step 1's single update starts at the reference
    assert all(later > 0 for later in kl_loss[1:]), kl_loss  # then the policy has moved: k3 KL > 0
    for step in (1, 2, 3, 4):  # GAE's advantages are whitened over the batch's response tokens
        assert records[step]["critic/advantages/mean"] == pytest.approx(0.0, abs=1e-5), step
        assert records[step]["actor/kl_coef"] == 0.001  # actor.kl_loss_coef's default


@needs("resume_straight")
def test_checkpoint_layout(straight):
    folder = straight[0] / "ckpt" / "global_step_4"
    names = {p.name for p in folder.iterdir()}
    assert names == {"actor", "critic", "data.pt", "trainer_state.pt"}
    actor = {p.name for p in (folder / "actor").iterdir()}
    assert {".metadata", "__0_0.distcp", "__1_0.distcp", "extra_state.pt", "rng_rank_0.pt", "rng_rank_1.pt"} <= actor
    hf = {p.name for p in (folder / "actor" / "huggingface").iterdir()}
    assert {"config.json", "tokenizer.json", "model.safetensors"} <= hf
    assert not any(p.name.startswith(".tmp_") for p in folder.parent.iterdir())


@needs("resume_straight")
def test_model_merger_on_a_trainer_checkpoint(tmp_path, straight):
    from transformers import AutoModelForCausalLM

    actor = straight[0] / "ckpt" / "global_step_4" / "actor"
    merge = [sys.executable, "-m", "verl.model_merger", "merge", "--backend", "fsdp", "--local_dir", str(actor)]
    proc = subprocess.run([*merge, "--target_dir", str(tmp_path / "merged")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    assert model.config.hidden_size == 128 and (tmp_path / "merged" / "tokenizer.json").exists()
    # the merged sharded state equals the HF weights the trainer wrote with hf_model, tensor for tensor
    test = [sys.executable, "-m", "verl.model_merger", "test", "--backend", "fsdp", "--local_dir", str(actor)]
    proc = subprocess.run([*test, "--test_hf_dir", str(actor / "huggingface")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]


@needs("resume_broken", "resume_other_model")
def test_missing_file_and_another_model_are_refused_by_name(cli_runs):
    code, output, _, _ = cli_runs["resume_broken"]
    assert code != 0 and "__1_0.distcp is missing" in output, output[-3000:]
    code, output, _, _ = cli_runs["resume_other_model"]
    assert code != 0 and "is of another model" in output and "hidden_size=128" in output, output[-3000:]


@cli_run("dapo_buffer_resumed", cost_s=30, after=("dapo_buffer",))
def _dapo_buffer_resumed(work: Path, deps: dict) -> Prepared:
    """The replay-buffer DAPO run resumed from step 1: its refills took prompts from the loader's next batch, and
    the ones left over are in the checkpoint."""
    folder = deps["dapo_buffer"].work / "ckpt" / "global_step_1"
    return Prepared([*DAPO_BUFFER, "trainer.resume_mode=resume_path", f"trainer.resume_from_path={folder}"], {})


@needs("dapo_buffer", "dapo_buffer_resumed")
def test_the_replay_buffer_schedule_resumes_exactly(cli_runs):
    code, output, records, _ = cli_runs["dapo_buffer_resumed"]
    assert code == 0, output[-3000:]
    assert_same_steps(steps(records), steps(cli_runs["dapo_buffer"].records))
