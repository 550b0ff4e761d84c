"""examples/data_preprocess: GSM8K from a local copy (parquet or jsonl layout) and the built-in arithmetic task."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from verl.utils.dataset import RLHFDataset
from verl.utils.demo import build_demo_tokenizer, make_arithmetic_rows
from verl.utils.reward_score import default_compute_score

SCRIPTS = Path(__file__).resolve().parents[3] / "examples" / "data_preprocess"

GSM8K_ROWS = [
    {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = <<3+4=7>>7\n#### 7"},
    {"question": "A car costs 1,200 dollars twice. Total?", "answer": "2 * 1200 = 2400\n#### 2,400"},
]


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(f"data_preprocess_{name}", SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def gsm8k():
    return load_script("gsm8k")


def write_jsonl(path: Path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def hf_layout(root: Path) -> Path:
    for config in ("main", "socratic"):
        (root / config).mkdir(parents=True)
        for split in ("train", "test"):
            rows = GSM8K_ROWS if config == "main" else [{"question": "socratic?", "answer": "#### 0"}]
            pq.write_table(pa.Table.from_pylist(rows), root / config / f"{split}-00000-of-00001.parquet")
    return root


class TestGsm8k:
    def test_hf_parquet_layout(self, gsm8k, tmp_path):
        out = tmp_path / "out"
        assert (
            gsm8k.main(["--local_dataset_path", str(hf_layout(tmp_path / "gsm8k")), "--local_save_dir", str(out)]) == 0
        )
        rows = pq.read_table(out / "train.parquet").to_pylist()
        assert len(rows) == 2 and len(pq.read_table(out / "test.parquet")) == 2  # socratic/ is not read
        first = rows[0]
        assert first["data_source"] == "openai/gsm8k" and first["ability"] == "math"
        assert first["prompt"] == [{"role": "user", "content": GSM8K_ROWS[0]["question"] + " " + gsm8k.INSTRUCTION}]
        assert first["reward_model"] == {"style": "rule", "ground_truth": "7"}
        assert first["extra_info"] == {
            "split": "train",
            "index": 0,
            "answer": GSM8K_ROWS[0]["answer"],
            "question": GSM8K_ROWS[0]["question"],
        }
        assert rows[1]["reward_model"]["ground_truth"] == "2400"  # thousands separator dropped
        # the output is a dataset the trainer reads, and the reference answer scores 1
        dataset = RLHFDataset(str(out / "train.parquet"), build_demo_tokenizer(), {"max_prompt_length": 256})
        assert len(dataset) == 2
        assert default_compute_score(first["data_source"], GSM8K_ROWS[0]["answer"], "7") == 1.0

    def test_github_jsonl_layout_and_the_deprecated_local_dir(self, gsm8k, tmp_path):
        for split in ("train", "test"):
            write_jsonl(tmp_path / "gsm8k" / f"{split}.jsonl", GSM8K_ROWS)
        out = tmp_path / "out"
        assert gsm8k.main(["--local_dataset_path", str(tmp_path / "gsm8k"), "--local_dir", str(out)]) == 0
        assert pq.read_table(out / "test.parquet").to_pylist()[1]["extra_info"]["split"] == "test"

    @pytest.mark.parametrize(
        ("row", "match"),
        [
            (
                {"question": "q", "answer": "no marker"},
                r"train.jsonl: row 1: field 'answer': must end with '#### <number>'",
            ),
            ({"question": "", "answer": "#### 1"}, r"train.jsonl: row 1: field 'question'"),
            ({"answer": "#### 1"}, r"train.jsonl: row 1: field 'question'"),
        ],
    )
    def test_malformed_rows_name_file_row_and_field(self, gsm8k, tmp_path, row, match):
        write_jsonl(tmp_path / "gsm8k" / "train.jsonl", [GSM8K_ROWS[0], row])
        write_jsonl(tmp_path / "gsm8k" / "test.jsonl", GSM8K_ROWS)
        with pytest.raises(ValueError, match=match):
            gsm8k.main(["--local_dataset_path", str(tmp_path / "gsm8k"), "--local_save_dir", str(tmp_path / "out")])

    def test_bad_json_line(self, gsm8k, tmp_path):
        (tmp_path / "train.jsonl").write_text(json.dumps(GSM8K_ROWS[0]) + "\n{oops\n")
        with pytest.raises(ValueError, match=r"train.jsonl: row 1: not valid JSON"):
            gsm8k.read_rows(str(tmp_path / "train.jsonl"))

    def test_missing_split_or_a_file_instead_of_a_folder(self, gsm8k, tmp_path):
        write_jsonl(tmp_path / "gsm8k" / "train.jsonl", GSM8K_ROWS)
        with pytest.raises(FileNotFoundError, match="no test split"):
            gsm8k.find_split(str(tmp_path / "gsm8k"), "test")
        with pytest.raises(ValueError, match="must be a folder"):
            gsm8k.find_split(str(tmp_path / "gsm8k" / "train.jsonl"), "train")

    def test_without_a_local_copy_and_no_network_it_fails_cleanly(self, gsm8k, tmp_path, monkeypatch, caplog):
        def offline():
            raise ConnectionError("no network")

        monkeypatch.setattr(gsm8k, "_load_from_hub", offline)
        assert gsm8k.main(["--local_save_dir", str(tmp_path / "out")]) == 1
        assert "--local_dataset_path" in caplog.text and not os.path.exists(tmp_path / "out")

    def test_rows_from_the_hub_are_converted(self, gsm8k, tmp_path, monkeypatch):
        monkeypatch.setattr(gsm8k, "_load_from_hub", lambda: {"train": GSM8K_ROWS, "test": GSM8K_ROWS[:1]})
        assert gsm8k.main(["--local_save_dir", str(tmp_path / "out")]) == 0
        assert len(pq.read_table(tmp_path / "out" / "test.parquet")) == 1


class TestArithmetic:
    def test_writes_the_demo_rows(self, tmp_path):
        script = load_script("arithmetic")
        argv = ["--local_save_dir", str(tmp_path), "--train_size", "12", "--test_size", "3", "--train_seed", "4"]
        assert script.main(argv) == 0
        assert pq.read_table(tmp_path / "train.parquet").to_pylist() == make_arithmetic_rows(12, 4, "train")
        assert pq.read_table(tmp_path / "test.parquet").to_pylist() == make_arithmetic_rows(3, 2, "test")

    def test_sizes_must_be_positive(self, tmp_path, capsys):
        with pytest.raises(SystemExit) as exit_info:
            load_script("arithmetic").main(["--local_save_dir", str(tmp_path), "--train_size", "0"])
        assert exit_info.value.code == 2  # argparse's usage error
        assert "error: --train_size and --test_size must be positive" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["arithmetic", "gsm8k"])
def test_scripts_run_from_the_command_line(name, tmp_path):
    """Smoke test, as a user runs them (the launch command in each docstring)."""
    args = [sys.executable, str(SCRIPTS / f"{name}.py"), "--local_save_dir", str(tmp_path / "out")]
    if name == "gsm8k":
        for split in ("train", "test"):
            write_jsonl(tmp_path / "gsm8k" / f"{split}.jsonl", GSM8K_ROWS)
        args += ["--local_dataset_path", str(tmp_path / "gsm8k")]
    result = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "wrote" in result.stderr and (tmp_path / "out" / "test.parquet").is_file()
