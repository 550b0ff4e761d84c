"""Resume is a contract: runs of ``python -m verl.trainer.main_ppo`` (subprocesses, Ray, 2 gloo workers, the hf
engine, CPU) that are killed and resumed log the same per-step metrics as an uninterrupted run; faults leave the
last checkpoint loadable and are reported by name."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.trainer.test_main_ppo import main_command, quickstart, read_jsonl, run_main

# 48 prompts of 16: 3 steps per epoch, so 4 steps cross an epoch boundary; 2 worker processes.
COMMON = (
    "trainer.n_gpus_per_node=2",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32",
    "data.train_max_samples=48",
    "trainer.total_epochs=3",
    "trainer.total_training_steps=4",
    "trainer.save_freq=1",
)
# what may differ between two runs of the same steps: wall-clock figures
NOT_COMPARED = ("timing", "time", "throughput", "memory", "seconds")


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


def _worker_pids() -> list[int]:
    """Processes of Ray actors of the fused worker class (their title is ``ray::WorkerDict_<roles>...``)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                title = (entry / "cmdline").read_bytes().split(b"\0")[0]
            except OSError:
                continue
            if title.startswith(b"ray::WorkerDict"):
                pids.append(int(entry.name))
    return pids


def test_a_killed_worker_stops_the_run_and_the_resumed_run_matches(tmp_path, straight):
    straight_dir, reference = straight
    args, env, log = main_command(tmp_path, *COMMON, name="killed")
    ckpt = tmp_path / "ckpt"
    proc = subprocess.Popen(args, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    tracker = ckpt / "latest_checkpointed_iteration.txt"
    deadline = time.monotonic() + 300
    while not (tracker.exists() and tracker.read_text().strip() == "2"):
        assert proc.poll() is None and time.monotonic() < deadline, "the run ended before its step-2 checkpoint"
        time.sleep(0.05)
    victims = _worker_pids()
    assert victims, "no worker process found"
    os.kill(victims[0], signal.SIGKILL)  # a training worker dies in the middle of step 3
    killed_at = time.monotonic()
    output, _ = proc.communicate(timeout=180)
    assert proc.returncode != 0
    stopped_after = time.monotonic() - killed_at
    print(f"the driver stopped {stopped_after:.1f} s after the worker was killed")
    assert stopped_after < 120  # the driver noticed and stopped, no hang
    assert "died while running" in output and "actor_rollout" in output and "in stage" in output, output[-3000:]

    # resume (trainer.resume_mode=auto): from step 2, through the epoch boundary after step 3, to step 4
    code, output, records = run_main(tmp_path, *COMMON, "trainer.max_actor_ckpt_to_keep=2", name="resumed")
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


def test_resume_from_an_epoch_boundary_neither_skips_nor_repeats(tmp_path, straight):
    straight_dir, reference = straight
    folder = straight_dir / "ckpt" / "global_step_3"  # the last step of epoch 0
    code, output, records = run_main(
        tmp_path,
        *COMMON,
        "trainer.resume_mode=resume_path",
        f"trainer.resume_from_path={folder}",
        f"trainer.rollout_data_dir={tmp_path / 'rollouts'}",
    )
    assert code == 0, output[-3000:]
    resumed = steps(records)
    assert sorted(resumed) == [4] and resumed[4]["training/epoch"] == 1
    assert_same_steps(resumed, reference)
    # the same prompts, in the same order, as the uninterrupted run's first batch of epoch 1
    ours = [r["input"] for r in read_jsonl(tmp_path / "rollouts" / "4.jsonl")]
    theirs = [r["input"] for r in read_jsonl(straight_dir / "rollouts" / "4.jsonl")]
    assert ours == theirs


def test_checkpoint_layout(straight):
    folder = straight[0] / "ckpt" / "global_step_4"
    names = {p.name for p in folder.iterdir()}
    assert names == {"actor", "data.pt", "trainer_state.pt"}
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


def test_missing_file_and_another_model_are_refused_by_name(tmp_path, straight):
    from verl.utils.demo import ensure_demo_assets

    source = straight[0] / "ckpt" / "global_step_4"
    broken = tmp_path / "broken" / "global_step_4"
    shutil.copytree(source, broken)
    (broken / "actor" / "__1_0.distcp").unlink()
    code, output, _ = run_main(
        tmp_path, *COMMON, "trainer.resume_mode=resume_path", f"trainer.resume_from_path={broken}", name="broken"
    )
    assert code != 0 and "__1_0.distcp is missing" in output, output[-3000:]

    # the same checkpoint, resumed with another model (narrower: same names, other shapes)
    from transformers import AutoConfig, AutoModelForCausalLM

    assets = ensure_demo_assets(tmp_path.parent / "verl_cache")
    other = tmp_path / "other_model"
    config = AutoConfig.from_pretrained(assets.model_path)
    config.hidden_size, config.intermediate_size = 64, 128
    AutoModelForCausalLM.from_config(config).save_pretrained(other)
    for file in Path(assets.model_path).iterdir():
        if file.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(file, other / file.name)
    overrides = quickstart(Path(assets.train_files).parent, str(other), "algorithm.adv_estimator=grpo")
    code, output, _ = run_main(
        tmp_path,
        *overrides,
        "actor_rollout_ref.rollout.n=2",
        "trainer.resume_mode=resume_path",
        f"trainer.resume_from_path={source}",
        name="other",
    )
    assert code != 0 and "is of another model" in output and "hidden_size=128" in output, output[-3000:]
