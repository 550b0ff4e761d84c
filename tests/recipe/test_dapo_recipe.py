"""``recipe/dapo``: its config composes from the base one with only base keys, and ``python -m recipe.dapo.main_dapo``
trains end to end (subprocess, Ray, FSDP workers, the hf engine, CPU) on tiny DAPO-style data.

The data are veRL's DAPO layout: ``data_source="math_dapo"``, an arithmetic question wrapped in DAPO-Math-17k's
answer-format instruction, the ground truth as a string, scored by ``default_compute_score`` → ``math_dapo``
(no custom reward function). The demo model is randomly initialised, so it never writes an ``Answer:`` line: every
response scores -1 and ``acc`` is always False. What varies is the length: the overlong buffer (8 of 16 response
tokens) penalises the responses that run past 8 tokens, so dynamic sampling filters on ``seq_reward`` (the score
plus that penalty) and keeps the groups whose two responses differ in length.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from tests.cli_runs import Prepared, cli_run, needs
from tests.trainer.test_main_ppo import demo_model
from verl.utils.reward_score.math_dapo import ANSWER_FORMAT

ROOT = Path(__file__).resolve().parents[2]
RECIPE_CONFIG = ROOT / "recipe" / "dapo" / "config"
RUN_SCRIPT = ROOT / "recipe" / "dapo" / "run_dapo_qwen2.5_0.5b.sh"


BASE_CONFIG = ROOT / "verl" / "trainer" / "config"


def compose(config_dir: Path, name: str, *overrides: str):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        return hydra_compose(config_name=name, overrides=list(overrides))


def compose_dapo(*overrides: str):
    return compose(RECIPE_CONFIG, "dapo_trainer", *overrides)


def leaf_keys(node: dict, prefix: str = "") -> list[str]:
    keys = []
    for key, value in node.items():
        path = f"{prefix}{key}"
        keys.extend(leaf_keys(value, f"{path}.") if isinstance(value, dict) and value else [path])
    return keys


# ------------------------------------------------------------------------------------------------------ config
def test_the_recipe_config_sets_only_base_keys():
    from verl.trainer.config.algorithm import FilterGroupsConfig

    base = compose(BASE_CONFIG, "ppo_trainer")
    recipe = yaml.safe_load((RECIPE_CONFIG / "dapo_trainer.yaml").read_text())
    assert recipe.pop("defaults") == ["ppo_trainer", "_self_"]
    assert recipe.pop("hydra") == {"searchpath": ["pkg://verl.trainer.config"]}
    for key in leaf_keys(recipe):
        if key.startswith("algorithm.filter_groups."):  # null in the base: its fields are FilterGroupsConfig's
            assert key.rsplit(".", 1)[1] in FilterGroupsConfig.__dataclass_fields__, key
        else:
            assert OmegaConf.select(base, key, default="<missing>") != "<missing>", key


def test_the_composed_config_is_dapo_and_valid(tmp_path):
    from verl.trainer.config.validate import validate_config

    config = compose_dapo(
        f"actor_rollout_ref.model.path={tmp_path}",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
    )
    validate_config(config, check_environment=False)
    actor = config.actor_rollout_ref.actor
    assert (actor.clip_ratio_low, actor.clip_ratio_high, actor.loss_agg_mode) == (0.2, 0.28, "token-mean")
    assert config.reward_manager.name == "dapo" and config.algorithm.adv_estimator == "grpo"
    assert config.algorithm.filter_groups.enable and config.algorithm.filter_groups.metric == "acc"
    assert config.data.gen_batch_size == config.data.train_batch_size
    # a base key the recipe does not set keeps the base value
    assert config.data.max_prompt_length == compose(BASE_CONFIG, "ppo_trainer").data.max_prompt_length


def test_the_cfg_job_command_prints_the_composed_config(cli, tmp_path):
    argv = [sys.executable, "-m", "recipe.dapo.main_dapo", "--cfg", "job", "data.train_batch_size=4"]
    proc = cli.command(argv, tmp_path, {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])})
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = yaml.safe_load(proc.stdout)
    assert printed["reward_model"]["reward_manager"] == "dapo"
    assert printed["data"]["train_batch_size"] == 4


def test_an_overlong_buffer_the_reward_manager_ignores_is_refused(tmp_path):
    from verl.trainer.config.validate import ConfigError, validate_config

    config = compose_dapo(
        f"actor_rollout_ref.model.path={tmp_path}",
        "reward_model.reward_manager=naive",
        "reward_model.overlong_buffer.enable=true",
        "reward_model.overlong_buffer.len=4",
    )
    with pytest.raises(ConfigError, match="reward manager 'naive' does not apply the overlong buffer"):
        validate_config(config, check_environment=False)


# ------------------------------------------------------------------------------------------------------ the script
def script_overrides(tmp_path: Path, **env: str) -> list[str]:
    """The key=value arguments the run script passes to ``python3 -m recipe.dapo.main_dapo`` (a stand-in python3)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    out = tmp_path / "argv.json"
    fake = bin_dir / "python3"
    fake.write_text(f"#!{sys.executable}\nimport json, sys\njson.dump(sys.argv[1:], open({str(out)!r}, 'w'))\n")
    fake.chmod(0o755)
    names = set(re.findall(r"^([A-Z][A-Z0-9_]*)=\$\{", RUN_SCRIPT.read_text(), re.M))
    environ = {k: v for k, v in os.environ.items() if k not in names}
    environ.update(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", **env)
    subprocess.run(["bash", str(RUN_SCRIPT), "extra.key=1"], check=True, env=environ, capture_output=True, timeout=30)
    argv = json.loads(out.read_text())
    assert argv[:2] == ["-m", "recipe.dapo.main_dapo"] and argv[-1] == "extra.key=1"
    return argv[2:-1]


def test_the_script_defaults_are_a_valid_gpu_dapo_config(tmp_path):
    from verl.trainer.config.validate import validate_config

    assert os.access(RUN_SCRIPT, os.X_OK)
    overrides = script_overrides(tmp_path, HOME="/home/user")
    keys = [o.split("=", 1)[0] for o in overrides]
    assert len(keys) == len(set(keys)), "a key is set twice"
    config = compose_dapo(*overrides)
    validate_config(config, check_environment=False)  # a GPU machine's config: its vllm need not be installed here
    assert config.data.gen_batch_size == 3 * config.data.train_batch_size
    assert config.reward_model.overlong_buffer.enable and config.reward_model.overlong_buffer.len == 1024
    assert config.actor_rollout_ref.rollout.name == "vllm" and config.trainer.n_gpus_per_node == 8


def test_the_documented_cpu_command_is_a_valid_config(tmp_path):
    from verl.trainer.config.validate import validate_config

    header = RUN_SCRIPT.read_text().split("set -xeuo pipefail", 1)[0].split("On CPU", 1)[1]
    lines = [line for line in header.splitlines() if "ensure_demo_assets" not in line and "print(" not in line]
    recipe = dict(re.findall(r"\b([A-Z][A-Z0-9_]*)=(\S+)", "\n".join(lines)))
    assert recipe["ROLLOUT_NAME"] == "hf" and recipe["N_GPUS"] == "1", recipe
    paths = {"MODEL_PATH": str(tmp_path), "TRAIN_FILES": "/demo/train.parquet", "VAL_FILES": "/demo/test.parquet"}
    config = compose_dapo(*script_overrides(tmp_path, **paths, **recipe))
    validate_config(config)
    assert config.data.max_response_length == int(recipe["MAX_RESPONSE_LENGTH"])
    assert config.algorithm.filter_groups.metric == "score"


# ------------------------------------------------------------------------------------------------------ a run
def write_dapo_parquet(path: Path, count: int, split: str) -> None:
    """Arithmetic questions in DAPO-Math-17k's layout (the instruction before and after the problem)."""
    import pandas as pd

    rows = []
    for i in range(count):
        a, b = i, i % 7  # every question differs
        problem = f"What is {a} + {b}?"
        rows.append(
            {
                "data_source": "math_dapo",
                "prompt": [{"role": "user", "content": f"{ANSWER_FORMAT[0]}\n\n{problem}\n\n{ANSWER_FORMAT[1]}"}],
                "ability": "MATH",
                "reward_model": {"style": "rule-lighteval/MATH_v2", "ground_truth": str(a + b)},
                "extra_info": {"index": i, "split": split},
            }
        )
    pd.DataFrame(rows).to_parquet(path)


@cli_run("dapo_recipe", cost_s=60)
def _dapo_recipe(tmp: Path) -> Prepared:
    """``python -m recipe.dapo.main_dapo`` on tiny DAPO-style data, 2 steps."""
    model = demo_model(tmp)
    write_dapo_parquet(tmp / "train.parquet", 320, "train")  # more prompts than a step's 20 batches can take
    write_dapo_parquet(tmp / "test.parquet", 4, "test")
    overrides = [
        f"data.train_files={tmp / 'train.parquet'}",
        f"data.val_files={tmp / 'test.parquet'}",
        "data.train_batch_size=4",
        "data.gen_batch_size=16",
        "data.max_prompt_length=256",
        "data.max_response_length=16",
        "data.dataloader_num_workers=0",
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
        "algorithm.filter_groups.metric=seq_reward",
        "algorithm.filter_groups.max_num_gen_batches=20",  # ~1 group in 10 has two lengths: room to spare
        "reward_model.overlong_buffer.enable=true",
        "reward_model.overlong_buffer.len=8",
        "reward_model.overlong_buffer.penalty_factor=1.0",
        "reward_model.overlong_buffer.log=true",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        "trainer.total_epochs=100",
        "trainer.total_training_steps=2",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        f"trainer.rollout_data_dir={tmp / 'rollouts'}",
    ]
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return Prepared(overrides, env, module="recipe.dapo.main_dapo")


@pytest.fixture
def dapo_run(cli_runs):
    run = cli_runs["dapo_recipe"]
    return run.work, run.returncode, run.output, [r for r in run.records if r["data"]]


@needs("dapo_recipe")
def test_the_recipe_trains_two_steps_with_dynamic_sampling(dapo_run):
    tmp, code, output, records = dapo_run
    assert code == 0, output[-4000:]
    assert [r["step"] for r in records] == [1, 2]
    assert "DAPO: dynamic sampling on 'seq_reward'" in output  # RayDAPOTrainer ran, with the overrides
    for record in records:
        data = record["data"]
        assert 1 <= data["train/num_gen_batches"] <= 20
        assert math.isfinite(data["critic/score/mean"])
        assert "actor/pg_loss" in data


@needs("dapo_recipe")
def test_the_dapo_scorer_and_the_overlong_buffer_scored_every_sample(dapo_run):
    tmp, code, output, records = dapo_run
    assert code == 0, output[-4000:]
    for step in (1, 2):
        rows = [json.loads(line) for line in (tmp / "rollouts" / f"{step}.jsonl").read_text().splitlines()]
        assert len(rows) == 4 * 2  # train_batch_size prompts × n after the filter
        by_prompt = defaultdict(list)
        for row in rows:
            assert {"acc", "pred", "overlong_reward", "overlong"} <= set(row), sorted(row)
            assert -1.0 <= row["overlong_reward"] <= 0.0 and row["overlong"] == (row["overlong_reward"] < 0)
            # DAPO's eq. 13 by hand: a response of L tokens past 16 - 8 loses (L - 8) / 8, so a multiple of 1/8
            assert row["overlong_reward"] * 8 == pytest.approx(round(row["overlong_reward"] * 8), abs=1e-6)
            # math_dapo's ±1, plus the overlong penalty
            assert row["score"] == pytest.approx((1.0 if row["acc"] else -1.0) + row["overlong_reward"])
            by_prompt[row["input"]].append(row["score"])
        # only informative groups were trained on: a prompt's responses do not all score the same
        assert all(len(set(scores)) > 1 for scores in by_prompt.values()), by_prompt
        # the full penalty (-1) is exactly the responses cut at 16 tokens: the trainer's clip ratio of that batch
        data = next(r["data"] for r in records if r["step"] == step)
        full = sum(row["overlong_reward"] == pytest.approx(-1.0) for row in rows) / len(rows)
        assert full == pytest.approx(data["response_length/clip_ratio"]), (full, data["response_length/clip_ratio"])
