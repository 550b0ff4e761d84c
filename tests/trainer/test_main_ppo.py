"""``python -m verl.trainer.main_ppo`` end to end, as a user runs it (subprocesses, Ray, real workers, CPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TIMEOUT_S = 600


def run_main(tmp_path: Path, *overrides: str, name: str = "run", env: dict | None = None) -> tuple[int, str, list]:
    """Run the CLI with the file logger into ``tmp_path``; returns (exit code, output, the jsonl records)."""
    log = tmp_path / f"{name}.jsonl"
    environ = dict(os.environ)
    environ.update(
        VERL_FILE_LOGGER_PATH=str(log),
        VERL_CACHE_DIR=str(tmp_path.parent / "verl_cache"),
        RAY_AUTH_MODE="disabled",
        HYDRA_FULL_ERROR="1",
        **(env or {}),
    )
    args = [
        sys.executable,
        "-m",
        "verl.trainer.main_ppo",
        "trainer.logger=[console,file]",
        f"hydra.run.dir={tmp_path / 'hydra'}",
        f"trainer.default_local_dir={tmp_path / 'ckpt'}",
        *overrides,
    ]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=TIMEOUT_S, env=environ, cwd=tmp_path)
    records = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return proc.returncode, proc.stdout + proc.stderr, records


def series(records: list, key: str) -> list[float]:
    return [r["data"][key] for r in records if key in r["data"]]


@pytest.mark.slow
def test_demo_learns_out_of_the_box(tmp_path):
    code, output, records = run_main(tmp_path)
    assert code == 0, output[-3000:]
    scores = series(records, "critic/score/mean")
    assert len(scores) == 40
    first, last = sum(scores[:5]) / 5, sum(scores[-5:]) / 5
    assert last - first >= 0.2, scores
    assert "Training Progress" in output  # the tqdm bar
    for key in (
        "actor/pg_loss",
        "actor/grad_norm",
        "timing_s/gen",
        "timing_s/update_actor",
        "timing_s/step",
        "response_length/mean",
        "prompt_length/mean",
        "perf/throughput",
        "perf/time_per_step",
    ):
        assert key in records[-1]["data"], key


def test_ppo_with_critic_and_kl_loss_runs(tmp_path):
    code, output, records = run_main(
        tmp_path,
        "algorithm.adv_estimator=gae",
        "critic.ppo_micro_batch_size_per_gpu=64",
        "critic.model.fsdp_config.dtype=float32",
        "actor_rollout_ref.actor.use_kl_loss=true",
        "trainer.total_training_steps=2",
    )
    assert code == 0, output[-3000:]
    data = records[-1]["data"]
    for key in (
        "critic/vf_loss",
        "critic/values/mean",
        "critic/vf_explained_var",
        "actor/kl_loss",
        "timing_s/ref",
        "timing_s/values",
        "timing_s/update_critic",
    ):
        assert key in data, key


def test_bad_config_fails_before_ray_naming_every_problem(tmp_path):
    code, output, _ = run_main(tmp_path, "trainer.mode=separate_async", "actor_rollout_ref.actor.clip_ratio=-1")
    assert code != 0
    assert "2 problem(s) in the config" in output and "trainer.mode='separate_async' is not available yet" in output
    assert "Started a local Ray instance" not in output
