"""The run scripts under ``examples/<algo>_trainer/``: well-formed, valid at their GPU defaults, and runnable.

Fast tests: each script exists, is executable, opens with its comment block and passes ``bash -n``; its command line
at the default (GPU) sizes, and with the settings of the "On CPU" lines of its comment block, captured with a
stand-in ``python3``, composes and passes ``validate_config``.

Slow tests (one per script): the script itself, run with ``bash`` (three at a time) on the built-in arithmetic task and
its tiny model (environment variables shrink every size: 8 prompts x 2 responses, 8 response tokens, 2 steps, the hf
engine, one CPU worker; the PPO and GRPO runs also validate on 8 prompts at the last step). They check the metrics of
each step, the metrics that prove the algorithm ran, and that the algorithm's keys reached the trainer (the composed
config Hydra writes to ``<hydra.run.dir>/.hydra/config.yaml``).
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.cli_runs import Prepared, cli_run, needs

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
CONFIG_DIR = ROOT / "verl" / "trainer" / "config"
STEPS = 2


@dataclass(frozen=True)
class Example:
    """One run script and what running it must show."""

    script: str
    config: dict  # dotted key -> expected value in the composed config
    metrics: tuple[str, ...]  # present and finite at every step
    absent: tuple[str, ...] = ()  # must not be logged
    env: dict = field(default_factory=dict)  # extra environment for the tiny run
    validate: bool = False  # also validate (8 prompts) at the last step; costs a few seconds

    @property
    def path(self) -> Path:
        return EXAMPLES / self.script

    @property
    def id(self) -> str:
        return self.path.stem.split("_", 2)[-1]  # run_<model>_<algo>


PG_METRICS = ("actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl", "actor/grad_norm", "critic/advantages/mean")

EXAMPLES_UNDER_TEST = [
    Example(
        "ppo_trainer/run_qwen2.5-3b_ppo.sh",
        {
            "algorithm.adv_estimator": "gae",
            "actor_rollout_ref.actor.policy_loss.loss_mode": "vanilla",
            "actor_rollout_ref.actor.use_kl_loss": False,
            "algorithm.use_kl_in_reward": False,
        },
        PG_METRICS + ("critic/vf_loss", "critic/vf_clipfrac", "critic/values/mean", "critic/vf_explained_var"),
        absent=("actor/kl_loss", "timing_s/ref"),
        env={"CRITIC_MICRO_BATCH_SIZE_PER_GPU": "16"},
        validate=True,
    ),
    Example(
        "grpo_trainer/run_qwen2.5-3b_grpo.sh",
        {
            "algorithm.adv_estimator": "grpo",
            "algorithm.norm_adv_by_std_in_grpo": True,
            "actor_rollout_ref.actor.loss_agg_mode": "token-mean",
            "actor_rollout_ref.actor.use_kl_loss": True,
            "actor_rollout_ref.actor.kl_loss_type": "low_var_kl",
        },
        PG_METRICS + ("actor/kl_loss", "timing_s/ref"),
        absent=("critic/vf_loss",),
        validate=True,
    ),
    Example(
        "grpo_trainer/run_qwen2.5-3b_drgrpo.sh",
        {
            "algorithm.adv_estimator": "grpo",
            "algorithm.norm_adv_by_std_in_grpo": False,
            "actor_rollout_ref.actor.loss_agg_mode": "seq-mean-token-sum-norm",
            "actor_rollout_ref.actor.use_kl_loss": False,
            "algorithm.use_kl_in_reward": False,
            "actor_rollout_ref.actor.entropy_coeff": 0,
        },
        PG_METRICS,
        absent=("critic/vf_loss", "actor/kl_loss", "timing_s/ref"),
    ),
    Example(
        "gspo_trainer/run_qwen2.5-3b_gspo.sh",
        {
            "algorithm.adv_estimator": "grpo",
            "actor_rollout_ref.actor.policy_loss.loss_mode": "gspo",
            "actor_rollout_ref.actor.loss_agg_mode": "seq-mean-token-mean",
            "actor_rollout_ref.actor.clip_ratio_low": 3e-4,
            "actor_rollout_ref.actor.clip_ratio_high": 4e-4,
        },
        PG_METRICS,
        absent=("critic/vf_loss", "actor/kl_loss"),
        # two updates per step (the second one is off-policy), two micro-batches each
        env={"PPO_MINI_BATCH_SIZE": "4", "PPO_MICRO_BATCH_SIZE_PER_GPU": "4"},
    ),
    Example(
        "cispo_trainer/run_qwen2.5-3b_cispo.sh",
        {
            "algorithm.adv_estimator": "grpo",
            "actor_rollout_ref.actor.policy_loss.loss_mode": "cispo",
            "actor_rollout_ref.actor.loss_agg_mode": "token-mean",
            "actor_rollout_ref.actor.clip_ratio_low": 1.0,
            "actor_rollout_ref.actor.clip_ratio_high": 0.28,
        },
        PG_METRICS,
        absent=("critic/vf_loss", "actor/kl_loss"),
        env={"PPO_MINI_BATCH_SIZE": "4", "PPO_MICRO_BATCH_SIZE_PER_GPU": "8"},  # two updates per step
    ),
    Example(
        "rloo_trainer/run_qwen2.5-3b_rloo.sh",
        {
            "algorithm.adv_estimator": "rloo",
            "algorithm.use_kl_in_reward": True,
            "algorithm.kl_penalty": "kl",
            "actor_rollout_ref.actor.use_kl_loss": False,
        },
        PG_METRICS + ("actor/reward_kl_penalty", "actor/reward_kl_penalty_coeff", "timing_s/ref"),
        absent=("critic/vf_loss", "actor/kl_loss"),
    ),
    Example(
        "reinforce_plus_plus_trainer/run_qwen2.5-3b_reinforce_plus_plus.sh",
        {
            "algorithm.adv_estimator": "reinforce_plus_plus",
            "algorithm.use_kl_in_reward": True,
            "algorithm.kl_penalty": "kl",
            "actor_rollout_ref.actor.use_kl_loss": False,
        },
        PG_METRICS + ("actor/reward_kl_penalty", "actor/reward_kl_penalty_coeff", "timing_s/ref"),
        absent=("critic/vf_loss", "actor/kl_loss"),
    ),
]

# Every variable a script reads (cleared from the environment so that the caller's own settings cannot leak in).
SCRIPT_VARIABLES = sorted(
    {name for ex in EXAMPLES_UNDER_TEST for name in re.findall(r"^([A-Z_]+)=\$\{", ex.path.read_text(), re.M)}
)


def _ids(examples: list[Example]) -> list[str]:
    return [ex.id for ex in examples]


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in SCRIPT_VARIABLES}
    env.update(extra)
    return env


def test_every_example_script_is_under_test():
    on_disk = sorted(str(p.relative_to(EXAMPLES)) for p in EXAMPLES.glob("*_trainer/run_*.sh"))
    assert on_disk == sorted(ex.script for ex in EXAMPLES_UNDER_TEST)


@pytest.mark.parametrize("example", EXAMPLES_UNDER_TEST, ids=_ids(EXAMPLES_UNDER_TEST))
def test_script_is_well_formed(example: Example):
    path = example.path
    assert path.is_file(), path
    assert os.access(path, os.X_OK), f"{path} is not executable (chmod +x)"
    text = path.read_text()
    lines = text.splitlines()
    assert lines[0] == "#!/usr/bin/env bash"
    header = []
    for line in lines[1:]:
        if not line.startswith("#"):
            break
        header.append(line)
    assert len(header) >= 10, "the comment block at the top is missing or short"
    block = "\n".join(header)
    for needed in ("What makes it", "Hardware", "On CPU", "ROLLOUT_NAME=hf", "N_GPUS=1"):
        assert needed in block, needed
    for key in example.config:  # every defining key is documented and set by the script
        assert key.rsplit(".", 1)[-1] in block, key
        assert re.search(rf"^\s+{re.escape(key)}=", text, re.M), key
    assert "set -xeuo pipefail" in text
    assert text.count("python3 -m verl.trainer.main_ppo") == 1  # one veRL-style command
    assert text.rstrip().endswith('"$@"')
    subprocess.run(["bash", "-n", str(path)], check=True, timeout=30)


def captured_overrides(example: Example, tmp_path: Path, **env: str) -> list[str]:
    """The key=value arguments the script passes to ``python3 -m verl.trainer.main_ppo`` (a stand-in python3)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    out = tmp_path / "argv.json"
    fake = bin_dir / "python3"
    fake.write_text(
        f"#!{sys.executable}\nimport json, sys\njson.dump(sys.argv[1:], open({str(out)!r}, 'w'))\n", encoding="utf-8"
    )
    fake.chmod(0o755)
    environ = _clean_env(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", **env)
    subprocess.run(["bash", str(example.path), "extra.key=1"], check=True, env=environ, capture_output=True, timeout=30)
    argv = json.loads(out.read_text())
    assert argv[:2] == ["-m", "verl.trainer.main_ppo"]
    assert argv[-1] == "extra.key=1"  # "$@" comes last
    return argv[2:-1]


def compose(overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return hydra_compose(config_name="ppo_trainer", overrides=overrides)


@pytest.mark.parametrize("example", EXAMPLES_UNDER_TEST, ids=_ids(EXAMPLES_UNDER_TEST))
def test_default_command_line_is_a_valid_gpu_config(example: Example, tmp_path):
    from verl.trainer.config.validate import validate_config

    overrides = captured_overrides(example, tmp_path, HOME="/home/user")
    keys = [o.split("=", 1)[0] for o in overrides]
    assert len(keys) == len(set(keys)), "a key is set twice"
    config = compose(overrides)
    validate_config(config, check_environment=False)  # a GPU machine's config: its vllm need not be installed here
    for key, value in example.config.items():
        assert OmegaConf.select(config, key) == value, key
    assert config.actor_rollout_ref.rollout.name == "vllm"
    assert config.trainer.n_gpus_per_node == 8
    assert list(config.trainer.logger) == ["console", "file"]
    assert config.data.train_files == "/home/user/data/gsm8k/train.parquet"
    assert config.actor_rollout_ref.model.path.startswith("Qwen/Qwen2.5-")


def cpu_recipe(example: Example) -> dict[str, str]:
    """The NAME=value settings of the "On CPU" lines in the script's comment block."""
    header = example.path.read_text().split("set -xeuo pipefail", 1)[0]
    recipe = header.split("On CPU", 1)[1]
    lines = [line for line in recipe.splitlines() if "ensure_demo_assets" not in line and "print(" not in line]
    return dict(re.findall(r"\b([A-Z][A-Z0-9_]*)=(\S+)", "\n".join(lines)))


@pytest.mark.parametrize("example", EXAMPLES_UNDER_TEST, ids=_ids(EXAMPLES_UNDER_TEST))
def test_documented_cpu_command_is_a_valid_config(example: Example, tmp_path):
    from verl.trainer.config.validate import validate_config

    recipe = cpu_recipe(example)
    assert recipe["ROLLOUT_NAME"] == "hf" and recipe["N_GPUS"] == "1", recipe
    # a model folder that exists: validation checks local model paths (the data files are read later, by the run)
    paths = {"MODEL_PATH": str(tmp_path), "TRAIN_FILES": "/demo/train.parquet", "VAL_FILES": "/demo/test.parquet"}
    config = compose(captured_overrides(example, tmp_path, **paths, **recipe))
    validate_config(config)
    assert config.actor_rollout_ref.rollout.name == "hf" and config.trainer.n_gpus_per_node == 1
    assert config.data.max_response_length == int(recipe["MAX_RESPONSE_LENGTH"])


def test_environment_variables_and_later_arguments_override_the_script(tmp_path):
    example = EXAMPLES_UNDER_TEST[1]
    overrides = captured_overrides(example, tmp_path, TRAIN_BATCH_SIZE="8", ROLLOUT_NAME="hf", LOGGER="[console]")
    # Hydra keeps the last value of a key given twice, so arguments after the script's own win.
    config = compose([*overrides, "data.train_batch_size=4", "actor_rollout_ref.actor.use_kl_loss=False"])
    assert config.data.train_batch_size == 4
    assert config.actor_rollout_ref.actor.use_kl_loss is False
    assert config.actor_rollout_ref.rollout.name == "hf"
    assert list(config.trainer.logger) == ["console"]
    assert config.trainer.total_training_steps is None  # TOTAL_TRAINING_STEPS defaults to null


# ---------------------------------------------------------------------------------------------------------- slow


def tiny_env(cache: Path, assets, log: Path, validate: bool) -> dict[str, str]:
    """Environment for a run on the built-in task: every size shrunk, hf engine, one CPU worker."""
    return {
        "MODEL_PATH": assets.model_path,
        "TRAIN_FILES": assets.train_files,
        "VAL_FILES": assets.val_files,
        "ROLLOUT_NAME": "hf",
        "ROLLOUT_TP": "1",
        "N_GPUS": "1",
        "NNODES": "1",
        "TRAIN_BATCH_SIZE": "8",
        "PPO_MINI_BATCH_SIZE": "8",
        "PPO_MICRO_BATCH_SIZE_PER_GPU": "16",
        "LOG_PROB_MICRO_BATCH_SIZE_PER_GPU": "16",
        "ROLLOUT_N": "2",
        "MAX_PROMPT_LENGTH": "32",
        "MAX_RESPONSE_LENGTH": "8",
        "TOTAL_EPOCHS": "1",
        "TOTAL_TRAINING_STEPS": str(STEPS),
        "VAL_BEFORE_TRAIN": "False",
        "TEST_FREQ": str(STEPS) if validate else "-1",  # one validation, at the last step, or none
        "SAVE_FREQ": "-1",
        "LOGGER": "[console,file]",
        "VERL_FILE_LOGGER_PATH": str(log),
        "VERL_CACHE_DIR": str(cache),
        "RAY_AUTH_MODE": "disabled",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "HYDRA_FULL_ERROR": "1",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",  # python3 = this interpreter
    }


def _declare_example_run(example: Example) -> None:
    """The CLI run ``example_<id>``: the script on the built-in task (see `tiny_env`)."""

    def prepare(work: Path) -> Prepared:
        from verl.utils.demo import ensure_demo_assets

        cache = work.parent / "verl_cache"
        unset = {k: None for k in SCRIPT_VARIABLES if k in os.environ}
        env = {**unset, **tiny_env(cache, ensure_demo_assets(cache), work / "metrics.jsonl", example.validate)}
        args = [
            f"hydra.run.dir={work / 'hydra'}",
            f"trainer.default_local_dir={work / 'ckpt'}",
            "data.val_max_samples=8",
            "actor_rollout_ref.model.enable_gradient_checkpointing=False",
            "critic.model.enable_gradient_checkpointing=False",
        ]
        return Prepared([], {**env, **example.env}, argv=["bash", str(example.path), *args])

    cli_run(f"example_{example.id}", cost_s=45)(prepare)


for _example in EXAMPLES_UNDER_TEST:
    _declare_example_run(_example)


@pytest.mark.slow
@pytest.mark.parametrize("example", EXAMPLES_UNDER_TEST, ids=_ids(EXAMPLES_UNDER_TEST))
@needs(*(f"example_{e.id}" for e in EXAMPLES_UNDER_TEST))
def test_example_runs_on_the_builtin_task(example: Example, cli_runs):
    run = cli_runs[f"example_{example.id}"]
    assert run.returncode == 0, run.output[-4000:]
    log, hydra_dir = run.work / "metrics.jsonl", run.work / "hydra"

    # The algorithm's keys reached the trainer: Hydra's record of the composed config.
    config = OmegaConf.load(hydra_dir / ".hydra" / "config.yaml")
    for key, value in example.config.items():
        assert OmegaConf.select(config, key) == value, key
    assert config.actor_rollout_ref.rollout.name == "hf" and config.data.train_batch_size == 8

    records = [json.loads(line) for line in log.read_text().splitlines()]
    for record in records:  # the file logger may also record the config the trainer received
        if isinstance(record.get("config"), dict):
            received = OmegaConf.create(record["config"])
            for key, value in example.config.items():
                assert OmegaConf.select(received, key) == value, key
    steps = [r["step"] for r in records if "actor/pg_loss" in r["data"]]
    assert steps == list(range(1, STEPS + 1)), steps
    for record in records:
        data = record["data"]
        if "actor/pg_loss" not in data:
            continue
        for key in example.metrics:
            assert key in data, (record["step"], key)
            assert math.isfinite(data[key]), (record["step"], key, data[key])
        for key in example.absent:
            assert key not in data, (record["step"], key)
    validated = any(k.startswith("val-core/verl/arithmetic/") for k in records[-1]["data"])
    assert validated == example.validate, sorted(records[-1]["data"])
    check_advantages(example, [r["data"] for r in records if "actor/pg_loss" in r["data"]])


def check_advantages(example: Example, steps: list[dict]) -> None:
    """What each estimator leaves in the advantage statistics (token-level, over the batch's response tokens;
    2 responses per prompt, scores in [0, 1]). Worked by hand from the estimators' formulas."""
    for data in steps:
        high, low, mean = (data[f"critic/advantages/{stat}"] for stat in ("max", "min", "mean"))
        if example.id in ("grpo", "gspo", "cispo"):  # (s - mean) / std of a pair: exactly ±1/√2, or 0 on a tie
            assert high == pytest.approx(0.0, abs=1e-4) or high == pytest.approx(2**-0.5, abs=1e-3), high
            assert low == pytest.approx(-high, abs=1e-6), (low, high)  # a pair's two advantages are opposite
        elif example.id == "drgrpo":  # s - mean of a pair: ±half the score gap, never normalised up
            assert 0.0 <= high <= 0.5 + 1e-6 and low == pytest.approx(-high, abs=1e-6), (low, high)
        elif example.id == "rloo":  # leave-one-out of a pair: R_i - R_j and R_j - R_i (R with the KL penalty)
            assert high >= 0.0 and low == pytest.approx(-high, abs=1e-5), (low, high)
        elif example.id in ("reinforce_plus_plus", "ppo"):  # whitened over the batch's response tokens
            assert mean == pytest.approx(0.0, abs=1e-4) and low < 0.0 < high, (low, mean, high)
        else:
            raise AssertionError(f"no advantage check for the {example.id} example: add one")


@pytest.mark.sglang
def test_the_grpo_script_runs_on_sglang(tmp_path, cli):
    """The GRPO script as a user runs it with ``ROLLOUT_NAME=sglang`` (the sglang venv; only paths and sizes
    changed): 2 steps on SGLang's engine in the hybrid engine (sync mode), validation at the last one."""
    pytest.importorskip("sglang", reason="runs in the sglang venv")
    from verl.utils.demo import ensure_demo_assets

    example = EXAMPLES_UNDER_TEST[1]
    assert example.id == "grpo"
    cache, log = tmp_path / "verl_cache", tmp_path / "metrics.jsonl"
    env = {k: None for k in SCRIPT_VARIABLES if k in os.environ}
    env.update(tiny_env(cache, ensure_demo_assets(cache), log, validate=True), ROLLOUT_NAME="sglang")
    args = [f"hydra.run.dir={tmp_path / 'hydra'}", f"trainer.default_local_dir={tmp_path / 'ckpt'}"]
    proc = cli.command(["bash", str(example.path), *args, "data.val_max_samples=8"], tmp_path, env)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    config = OmegaConf.load(tmp_path / "hydra" / ".hydra" / "config.yaml")
    assert config.actor_rollout_ref.rollout.name == "sglang" and config.algorithm.adv_estimator == "grpo"
    records = [json.loads(line) for line in log.read_text().splitlines()]
    steps = [r["data"] for r in records if "actor/pg_loss" in r["data"]]
    assert len(steps) == STEPS
    for data in steps:  # generated by SGLang through the AgentLoop; the trainer scores its samples alike
        assert data["agent_loop/generate_sequences/max"] > 0 and data["response_length/mean"] > 0
        assert data["training/rollout_probs_diff_max"] < 1e-3, data["training/rollout_probs_diff_max"]
        assert data["weight_sync/tensors"] > 0
    assert [d["async/weight_version"] for d in steps] == [0, 1]
    assert any(k.startswith("val-core/verl/arithmetic/") for k in records[-1]["data"])
    check_advantages(example, steps)
