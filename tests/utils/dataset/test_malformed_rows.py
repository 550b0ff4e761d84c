"""Malformed rows in real parquet files are found when the dataset is built, the way the trainer builds it.

A null ``reward_model``, one without a ``ground_truth`` (unless its style is ``"model"``) or a prompt that is not a
list of chat messages is an error naming the file and the row within it; ``data.filter_malformed_rows`` drops them
and logs how many per file.
"""

from __future__ import annotations

import logging
import re

import pandas as pd
import pytest
from omegaconf import OmegaConf

from verl.utils.dataset import create_rl_dataset
from verl.utils.demo import build_demo_tokenizer

LOGGER = "verl.utils.dataset.rl_dataset"


@pytest.fixture(scope="module")
def tokenizer():
    return build_demo_tokenizer()


def row(i: int, **fields) -> dict:
    """A well-formed row in veRL's schema, with ``fields`` replaced."""
    good = {
        "data_source": "verl/arithmetic",
        "prompt": [{"role": "user", "content": f"What is {i} + 1?"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(i + 1)},
        "extra_info": {"split": "train", "index": i},
    }
    return {**good, **fields}


def write(path, rows: list[dict]) -> str:
    """Write ``rows`` as a user would: a pandas DataFrame saved with ``to_parquet``."""
    pd.DataFrame(rows).to_parquet(path)
    return str(path)


def build(files, tokenizer, **data):
    return create_rl_dataset(files, OmegaConf.create({"max_prompt_length": 32, **data}), tokenizer)


@pytest.fixture
def bad_files(tmp_path) -> tuple[str, str]:
    """a.parquet: rows 1 (null reward_model) and 3 (no ground_truth) bad; b.parquet: every prompt a plain string."""
    a = write(
        tmp_path / "a.parquet",
        [row(0), row(1, reward_model=None), row(2), row(3, reward_model={"style": "rule"}), row(4)],
    )
    b = write(tmp_path / "b.parquet", [row(5, prompt="What is 5 + 1?"), row(6, prompt="What is 6 + 1?")])
    return a, b


class TestError:
    def test_names_file_row_and_problem(self, tokenizer, bad_files):
        a, b = bad_files
        with pytest.raises(ValueError) as e:
            build([a, b], tokenizer)
        msg = str(e.value)
        assert msg.startswith(f"4 malformed data row(s) ({a}: 2, {b}: 2):")
        assert f"{a}: row 1: field 'reward_model': is null" in msg
        assert f"{a}: row 3: field 'reward_model.ground_truth'" in msg
        assert f"{b}: row 0: field 'prompt': expected a non-empty list of chat messages, got 'What is 5 + 1?'" in msg
        assert f"{b}: row 1: field 'prompt'" in msg
        assert not re.search(rf"{re.escape(a)}: row [024]\b", msg)  # the good rows are not listed
        assert "data.filter_malformed_rows=True" in msg

    def test_the_right_file_of_two(self, tokenizer, tmp_path):
        good = write(tmp_path / "good.parquet", [row(i) for i in range(3)])
        bad = write(tmp_path / "bad.parquet", [row(0), row(1), row(2, reward_model=None)])
        for files in ([good, bad], [bad, good]):
            with pytest.raises(ValueError, match=r"^1 malformed data row\(s\)") as e:
                build(files, tokenizer)
            assert f"{bad}: row 2: field 'reward_model'" in str(e.value) and good not in str(e.value)

    def test_a_missing_ground_truth_field(self, tokenizer, tmp_path):
        path = write(tmp_path / "a.parquet", [row(i, reward_model={"style": "rule"}) for i in range(2)])
        with pytest.raises(ValueError, match=r"row 0: field 'reward_model.ground_truth': missing"):
            build(path, tokenizer)

    def test_a_row_lists_all_its_problems(self, tokenizer, tmp_path):
        path = write(tmp_path / "a.parquet", [row(0, prompt="hi", reward_model=None)])
        with pytest.raises(ValueError, match=r"row 0: field 'prompt': .*; field 'reward_model': is null"):
            build(path, tokenizer)

    def test_validation_files_are_checked(self, tokenizer, tmp_path):
        train = write(tmp_path / "train.parquet", [row(i) for i in range(3)])
        val = write(tmp_path / "val.parquet", [row(0), row(1, reward_model={"style": "rule", "ground_truth": None})])
        cfg = OmegaConf.create({"train_files": train, "val_files": val, "max_prompt_length": 32})
        assert len(create_rl_dataset(cfg.train_files, cfg, tokenizer)) == 3
        with pytest.raises(ValueError, match=rf"{re.escape(val)}: row 1: field 'reward_model.ground_truth'"):
            create_rl_dataset(cfg.val_files, cfg, tokenizer, is_train=False)

    def test_model_scored_rows_need_no_ground_truth(self, tokenizer, tmp_path):
        path = write(tmp_path / "a.parquet", [row(i, reward_model={"style": "model"}) for i in range(2)])
        ds = build(path, tokenizer)
        assert len(ds) == 2 and ds[0]["reward_model"] == {"style": "model"}

    def test_a_dictconfig_without_the_key_means_no_filtering(self, tokenizer, bad_files):
        cfg = OmegaConf.create({"max_prompt_length": 32})
        OmegaConf.set_struct(cfg, True)  # as the trainer's config is: a missing key must not raise
        with pytest.raises(ValueError, match="malformed"):
            create_rl_dataset(list(bad_files), cfg, tokenizer)


class TestFilter:
    def test_drops_them_and_logs_the_count_per_file(self, tokenizer, bad_files, caplog):
        a, b = bad_files
        good = write(bad_files[0].replace("a.parquet", "c.parquet"), [row(7)])
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            ds = build([a, b, good], tokenizer, filter_malformed_rows=True)
        assert [ds[i]["extra_info"]["index"] for i in range(len(ds))] == [0, 2, 4, 7]
        messages = [r.getMessage() for r in caplog.records if r.name == LOGGER]
        assert f"{a}: dropped 2 of 5 rows as malformed (data.filter_malformed_rows)" in messages
        assert f"{b}: dropped 2 of 2 rows as malformed (data.filter_malformed_rows)" in messages
        assert not any(good in m for m in messages)

    def test_nothing_logged_for_clean_files(self, tokenizer, tmp_path, caplog):
        path = write(tmp_path / "a.parquet", [row(i) for i in range(3)])
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            assert len(build(path, tokenizer, filter_malformed_rows=True)) == 3
        assert not [r for r in caplog.records if r.name == LOGGER]

    def test_dropping_every_row_is_an_error(self, tokenizer, bad_files):
        with pytest.raises(ValueError, match=r"dropped all 2 row\(s\)"):
            build(bad_files[1], tokenizer, filter_malformed_rows=True)
