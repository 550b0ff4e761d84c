"""Offline generation and evaluation as a user runs them: ``python -m verl.trainer.main_generation`` on the demo's
arithmetic prompts (CPU workers, the hf engine; 2 workers with batches that do not divide over them), then
``python -m verl.trainer.main_eval`` on what it wrote; config problems, custom and failing reward functions
in-process."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf

from tests.cli_runs import Prepared, cli_run, needs
from verl.trainer import main_generation
from verl.trainer.config.compose import compose_config
from verl.trainer.config.validate import ConfigError
from verl.trainer.main_eval import run_eval
from verl.trainer.main_generation import validate_generation_config
from verl.utils.dataset.rl_dataset import TRUNCATION_MODES
from verl.utils.demo import DEMO_DATA_SOURCE, ensure_demo_assets
from verl.utils.reward_score.arithmetic import compute_score as arithmetic_score
from verl.workers.reward_manager.abstract import RewardFunctionError

N_PROMPTS = 6
RESPONSE_LENGTH = 6


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("generation_eval")


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return ensure_demo_assets(tmp_path_factory.getbasetemp() / "verl_cache")  # the cache the CLI runs share


@pytest.fixture(scope="module")
def prompts_file(assets, work) -> Path:
    return write_prompts(work / "prompts.parquet", assets)


def write_prompts(path: Path, assets) -> Path:
    pd.read_parquet(assets.val_files).head(N_PROMPTS).to_parquet(path)
    return path


# Two generation runs (CLI runs, started by the session's scheduler)
GENERATION_RUNS = {
    # 2 greedy samples per prompt on 1 worker, batches of 4 (the last one has 2 prompts)
    "greedy": (1, "data.n_samples=2", "data.batch_size=4", "rollout.do_sample=false"),
    # 3 samples at temperature 1 per prompt, batches of 5: 15 and 3 rows, padded to the 2 workers
    "sampled": (2, "data.n_samples=3", "data.batch_size=5", "rollout.temperature=1.0", "rollout.top_k=-1"),
}


def cli_args(module: str, cwd: Path, *overrides: str) -> list[str]:
    """``python -m <module> <overrides>`` writing Hydra's folder into ``cwd``."""
    return [sys.executable, "-m", module, f"hydra.run.dir={cwd / 'hydra'}", *overrides]


def _declare_generation(name: str, workers: int, *overrides: str) -> None:
    def prepare(work: Path) -> Prepared:
        assets = ensure_demo_assets(work.parent / "verl_cache")
        argv = cli_args(
            "verl.trainer.main_generation",
            work,
            "trainer.nnodes=1",
            f"trainer.n_gpus_per_node={workers}",
            "trainer.device=cpu",
            f"data.path={write_prompts(work / 'prompts.parquet', assets)}",
            f"data.output_path={work / 'out.parquet'}",
            f"model.path={assets.model_path}",
            "rollout.name=hf",
            "rollout.dtype=float32",
            "rollout.prompt_length=32",
            f"rollout.response_length={RESPONSE_LENGTH}",
            *overrides,
        )
        return Prepared([], {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}, argv=argv)

    cli_run(f"generation_{name}", cost_s=30)(prepare)


for _name, (_workers, *_overrides) in GENERATION_RUNS.items():
    _declare_generation(_name, _workers, *_overrides)


def generated_file(cli_runs, name: str) -> Path:
    run = cli_runs[f"generation_{name}"]
    assert run.returncode == 0, run.output[-6000:]
    return run.work / "out.parquet"


@pytest.fixture
def greedy(cli_runs) -> pd.DataFrame:
    return pd.read_parquet(generated_file(cli_runs, "greedy"))


@pytest.fixture
def sampled(cli_runs) -> tuple[Path, pd.DataFrame]:
    path = generated_file(cli_runs, "sampled")
    return path, pd.read_parquet(path)


def eval_config(path: Path, *dotlist: str):
    """An ``evaluation`` config for in-process runs (scoring in threads); unknown keys are kept for validation."""
    base = compose_config("evaluation")
    return OmegaConf.merge(base, OmegaConf.from_dotlist([f"data.path={path}", "reward_model.num_workers=0", *dotlist]))


def demo_scores(frame: pd.DataFrame) -> list[list[float]]:
    """The demo's scorer on every response, called here directly."""
    return [
        [arithmetic_score(r, row.reward_model["ground_truth"], dict(row.extra_info))["score"] for r in row.responses]
        for row in frame.itertuples()
    ]


# ------------------------------------------------------------------------------------------------------ generation
@needs("generation_greedy")
def test_generation_keeps_every_input_column_and_adds_n_responses(greedy, prompts_file):
    prompts = pd.read_parquet(prompts_file)
    assert list(greedy.columns) == [*prompts.columns, "responses"] and len(greedy) == N_PROMPTS
    pd.testing.assert_frame_equal(greedy[list(prompts.columns)], prompts)
    for responses in greedy["responses"]:
        assert len(responses) == 2 and all(isinstance(r, str) for r in responses)
        assert responses[0] == responses[1]  # greedy: both samples are the same
    assert any(r for responses in greedy["responses"] for r in responses)  # the model said something


@needs("generation_sampled")
def test_sampled_responses_mostly_differ(sampled):
    _, frame = sampled
    assert len(frame) == N_PROMPTS and all(len(r) == 3 for r in frame["responses"])
    distinct = [len(set(r)) > 1 for r in frame["responses"]]
    assert sum(distinct) >= N_PROMPTS // 2, list(frame["responses"])


def test_generation_config_problems_are_named_before_anything_starts(assets, prompts_file):
    config = compose_config("generation")
    config.data.path = str(prompts_file)
    config.model.path = assets.model_path
    config.rollout.n = 2
    config.rollout.free_cache_engine = True
    config.data.batch_size = 0
    with pytest.raises(ConfigError) as info:
        validate_generation_config(config)
    text = str(info.value)
    assert "rollout.n=2" in text and "data.n_samples" in text
    assert "rollout.free_cache_engine=true" in text
    assert "data.batch_size=0 must be an integer >= 1" in text
    config = compose_config("generation")
    config.data.truncation = "start"
    with pytest.raises(ConfigError, match=r"data\.truncation='start'; use one of \['error', 'left'"):
        validate_generation_config(config)
    assert main_generation.TRUNCATION_MODES == TRUNCATION_MODES  # the validator's copy of the dataset's modes
    config = compose_config("generation")
    config.data.sampels = 3
    with pytest.raises(ConfigError, match=r"unknown key 'data\.sampels'; the keys at data are: .*n_samples"):
        validate_generation_config(config)


# ------------------------------------------------------------------------------------------------------ evaluation
@needs("generation_sampled")
def test_eval_cli_prints_the_demo_scorers_test_score(sampled, cli, tmp_path):
    path, frame = sampled
    proc = cli.command(cli_args("verl.trainer.main_eval", tmp_path, f"data.path={path}"), tmp_path)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-8000:]
    stdout = proc.stdout
    printed = [line for line in stdout.splitlines() if line.startswith("{")]
    assert len(printed) == 1, stdout
    metrics = ast.literal_eval(printed[0])
    scores = demo_scores(frame)
    expected = sum(sum(row) / len(row) for row in scores) / len(scores)
    assert metrics[f"test_score/{DEMO_DATA_SOURCE}"] == pytest.approx(expected, abs=1e-12)
    assert metrics[f"pass@1/{DEMO_DATA_SOURCE}"] == pytest.approx(sum(row[0] for row in scores) / len(scores))
    assert metrics[f"mean@3/{DEMO_DATA_SOURCE}"] == pytest.approx(expected)
    assert set(metrics) == {f"{m}/{DEMO_DATA_SOURCE}" for m in ("test_score", "pass@1", "mean@3")}


@needs("generation_sampled")
def test_eval_uses_a_custom_reward_function_with_verls_signature(sampled, tmp_path):
    path, frame = sampled
    reward_file = tmp_path / "my_reward.py"
    reward_file.write_text(
        "def length_score(data_source, solution_str, ground_truth, extra_info=None, scale=1.0):\n"
        "    assert extra_info['split'] == 'test'\n"
        "    return scale * len(solution_str)\n"
    )
    config = eval_config(
        path,
        f"custom_reward_function.path={reward_file}",
        "custom_reward_function.name=length_score",
        "custom_reward_function.reward_kwargs.scale=0.5",
    )
    metrics = run_eval(config)
    lengths = [[0.5 * len(r) for r in responses] for responses in frame["responses"]]
    expected = sum(sum(row) / len(row) for row in lengths) / len(lengths)
    assert metrics[f"test_score/{DEMO_DATA_SOURCE}"] == pytest.approx(expected)
    assert metrics[f"pass@1/{DEMO_DATA_SOURCE}"] == pytest.approx(sum(row[0] for row in lengths) / len(lengths))


@needs("generation_sampled")
def test_eval_names_a_bad_key_a_missing_column_and_a_reward_function_that_always_fails(sampled, tmp_path):
    path, _ = sampled
    with pytest.raises(ConfigError, match=r"unknown key 'data\.respones_key'; the keys at data are: .*response_key"):
        run_eval(eval_config(path, "data.respones_key=responses"))
    with pytest.raises(ValueError, match=r"no column 'answers' \(data\.response_key\); its columns: .*'responses'"):
        run_eval(eval_config(path, "data.response_key=answers"))
    reward_file = tmp_path / "broken.py"
    reward_file.write_text("def always_fails(data_source, solution_str, ground_truth, extra_info=None):\n    1 / 0\n")
    config = eval_config(path, f"custom_reward_function.path={reward_file}", "custom_reward_function.name=always_fails")
    with pytest.raises(RewardFunctionError, match=r"always_fails .*broken\.py.* failed on every one of the 18"):
        run_eval(config)
