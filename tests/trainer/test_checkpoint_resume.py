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
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.trainer.test_main_ppo import main_command, quickstart, read_jsonl, run_main

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


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> tuple[Path, dict[int, dict]]:
    """4 steps without interruption, a checkpoint after each (with HF weights)."""
    tmp = tmp_path_factory.mktemp("straight")
    code, output, records = run_main(
        tmp,
        *COMMON,
        f"trainer.rollout_data_dir={tmp / 'rollouts'}",
        "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]",
    )
    assert code == 0, output[-3000:]
    return tmp, steps(records)


def _parents() -> dict[int, int]:
    """``{pid: parent pid}`` of every process on the machine."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:  # /proc/<pid>/stat: "pid (comm) state ppid ..."; comm may hold spaces, so split after ")"
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    return parents


def _descendants(root: int) -> set[int]:
    """The processes started, directly or not, by ``root`` (Ray's raylet and its workers descend from the driver)."""
    parents = _parents()
    found: set[int] = set()
    for pid in parents:
        chain, cur = [], pid
        while cur in parents and cur not in (0, 1, root) and cur not in found:
            chain.append(cur)
            cur = parents[cur]
        if cur == root or cur in found:
            found.update(chain)
    return found


def _worker_pids(root: int) -> list[int]:
    """Processes of this run's Ray actors of the fused worker class (title ``ray::WorkerDict_<roles>...``), and
    only this run's: descendants of its driver process ``root``, never another run's workers on the machine."""
    pids = []
    for pid in sorted(_descendants(root)):
        try:
            title = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
        except OSError:
            continue
        if title.startswith(b"ray::WorkerDict"):
            pids.append(pid)
    return pids


def _resume_at_the_epoch_boundary(work: Path, straight_dir: Path) -> tuple[int, str, list, Path]:
    folder = straight_dir / "ckpt" / "global_step_3"  # the last step of epoch 0
    return *run_main(
        work,
        *COMMON,
        "trainer.resume_mode=resume_path",
        f"trainer.resume_from_path={folder}",
        f"trainer.rollout_data_dir={work / 'rollouts'}",
    ), work


def _refused_resumes(work: Path, straight_dir: Path) -> dict[str, tuple[int, str, list]]:
    """A checkpoint with a missing file, and the same checkpoint resumed with another (narrower) model."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from verl.utils.demo import ensure_demo_assets

    source = straight_dir / "ckpt" / "global_step_4"
    broken = work / "broken" / "global_step_4"
    shutil.copytree(source, broken)
    (broken / "actor" / "__1_0.distcp").unlink()
    runs = {}
    runs["broken"] = run_main(
        work, *COMMON, "trainer.resume_mode=resume_path", f"trainer.resume_from_path={broken}", name="broken"
    )
    assets = ensure_demo_assets(work.parent / "verl_cache")
    other = work / "other_model"
    config = AutoConfig.from_pretrained(assets.model_path)
    config.hidden_size, config.intermediate_size = 64, 128
    AutoModelForCausalLM.from_config(config).save_pretrained(other)
    for file in Path(assets.model_path).iterdir():
        if file.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(file, other / file.name)
    overrides = quickstart(Path(assets.train_files).parent, str(other), "algorithm.adv_estimator=grpo")
    runs["other"] = run_main(
        work,
        *overrides,
        "actor_rollout_ref.rollout.n=2",
        "trainer.resume_mode=resume_path",
        f"trainer.resume_from_path={source}",
        name="other",
    )
    return runs


@pytest.fixture(scope="module")
def side_runs(tmp_path_factory, straight):
    """The runs that only read the straight run's checkpoints, started in two threads as soon as it is done, so they
    overlap with the killed-worker test's runs (most of a run is Ray and the workers starting up)."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        yield {
            "epoch": pool.submit(_resume_at_the_epoch_boundary, tmp_path_factory.mktemp("epoch"), straight[0]),
            "refused": pool.submit(_refused_resumes, tmp_path_factory.mktemp("refused"), straight[0]),
        }


# three runs (the straight one, killed, resumed), beside the side runs: ~5 minutes on a 2-core machine
@pytest.mark.timeout(900)
def test_a_killed_worker_stops_the_run_and_the_resumed_run_matches(tmp_path, straight, side_runs):
    straight_dir, reference = straight
    args, env, log = main_command(tmp_path, *COMMON, name="killed")
    ckpt = tmp_path / "ckpt"
    proc = subprocess.Popen(args, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    tracker = ckpt / "latest_checkpointed_iteration.txt"
    deadline = time.monotonic() + 300
    while not (tracker.exists() and tracker.read_text().strip() == "2"):
        assert proc.poll() is None and time.monotonic() < deadline, "the run ended before its step-2 checkpoint"
        time.sleep(0.05)
    victims = _worker_pids(proc.pid)
    assert len(victims) == 2, f"expected this run's 2 worker processes, found {victims}"
    os.kill(victims[0], signal.SIGKILL)  # a training worker dies in the middle of step 3
    killed_at = time.monotonic()
    output, _ = proc.communicate(timeout=180)
    assert proc.returncode != 0
    stopped_after = time.monotonic() - killed_at
    print(f"the driver stopped {stopped_after:.1f} s after the worker was killed")
    assert stopped_after < 120  # the driver noticed and stopped, no hang
    assert "died while running" in output and "actor_rollout" in output and "in stage" in output, output[-3000:]

    # resume (trainer.resume_mode=auto): from step 2, through the epoch boundary after step 3, to step 4
    keep_two = ("trainer.max_actor_ckpt_to_keep=2", "trainer.max_critic_ckpt_to_keep=2")
    code, output, records = run_main(tmp_path, *COMMON, *keep_two, name="resumed")
    assert code == 0, output[-3000:]
    assert "resumed from" in output and "global_step_2" in output
    resumed = steps(records)
    assert sorted(resumed) == [3, 4] and resumed[4]["training/epoch"] == 1
    assert_same_steps(resumed, reference)
    assert_same_steps({k: v for k, v in steps(read_jsonl(log)).items() if k <= 2}, reference)
    # rotation kept the newest two, and the tracker points at the last
    assert sorted(p.name for p in ckpt.iterdir() if p.name.startswith("global_step_")) == [
        "global_step_3",
        "global_step_4",
    ]
    assert tracker.read_text().strip() == "4"
    # the trainer state written at the end is the uninterrupted run's (random states aside: pickled generators)
    from verl.utils.checkpoint.checkpoint_manager import TRAINER_STATE_FILE, load_state_file

    ours = load_state_file(str(ckpt / "global_step_4" / TRAINER_STATE_FILE))
    theirs = load_state_file(str(straight_dir / "ckpt" / "global_step_4" / TRAINER_STATE_FILE))
    keys = ("global_steps", "epoch", "weight_version", "kl_coef", "source", "roles")
    assert {k: ours[k] for k in keys} == {k: theirs[k] for k in keys}
    assert (ours["global_steps"], ours["epoch"], ours["weight_version"]) == (4, 1, 4)  # one weight push per step


@pytest.mark.timeout(900)
def test_resume_from_an_epoch_boundary_neither_skips_nor_repeats(straight, side_runs):
    straight_dir, reference = straight
    code, output, records, work = side_runs["epoch"].result()
    assert code == 0, output[-3000:]
    resumed = steps(records)
    assert sorted(resumed) == [4] and resumed[4]["training/epoch"] == 1
    assert_same_steps(resumed, reference)
    # the same prompts, in the same order, as the uninterrupted run's first batch of epoch 1
    ours = [r["input"] for r in read_jsonl(work / "rollouts" / "4.jsonl")]
    theirs = [r["input"] for r in read_jsonl(straight_dir / "rollouts" / "4.jsonl")]
    assert ours == theirs


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


def test_checkpoint_layout(straight):
    folder = straight[0] / "ckpt" / "global_step_4"
    names = {p.name for p in folder.iterdir()}
    assert names == {"actor", "critic", "data.pt", "trainer_state.pt"}
    actor = {p.name for p in (folder / "actor").iterdir()}
    assert {".metadata", "__0_0.distcp", "__1_0.distcp", "extra_state.pt", "rng_rank_0.pt", "rng_rank_1.pt"} <= actor
    hf = {p.name for p in (folder / "actor" / "huggingface").iterdir()}
    assert {"config.json", "tokenizer.json", "model.safetensors"} <= hf
    assert not any(p.name.startswith(".tmp_") for p in folder.parent.iterdir())


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


@pytest.mark.timeout(900)
def test_missing_file_and_another_model_are_refused_by_name(side_runs):
    runs = side_runs["refused"].result()
    code, output, _ = runs["broken"]
    assert code != 0 and "__1_0.distcp is missing" in output, output[-3000:]
    code, output, _ = runs["other"]
    assert code != 0 and "is of another model" in output and "hidden_size=128" in output, output[-3000:]
