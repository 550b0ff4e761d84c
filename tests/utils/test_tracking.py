"""verl.utils.tracking: each backend writes into a temp dir and the test reads back what it wrote with the
backend's own reader (jsonl, TensorBoard's EventAccumulator, MlflowClient, wandb's offline run file); then one
real trainer run with every backend (shared with test_plot.py)."""

from __future__ import annotations

import json
import logging
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.cli_runs import needs
from tests.utils._real_run import BACKENDS, RUN, STEPS, VAL_SAMPLES, real_run
from verl.utils.tracking import DapoFilteredRewardTableLogger, Tracking, ValidationGenerationsLogger
from verl.utils.tracking.backends import default_mlflow_uri, mlflow_key

CONFIG = {"trainer": {"project_name": "proj", "total_training_steps": 3, "logger": ["x"]}, "algorithm": {"gamma": 1.0}}
SAMPLES = [("1+1=", "2", 1.0), ("a | b\nc", "out", np.float32(0.0))]


class ListHandler(logging.Handler):
    """Collects the formatted messages of one logger."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def console_messages():
    handler = ListHandler()
    log = logging.getLogger("verl.console")
    log.addHandler(handler)
    yield handler.messages
    log.removeHandler(handler)


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    """cwd = tmp_path and no tracker env from outside."""
    monkeypatch.chdir(tmp_path)
    for name in ("VERL_FILE_LOGGER_PATH", "TENSORBOARD_DIR", "MLFLOW_TRACKING_URI", "WANDB_MODE", "WANDB_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb"))
    return tmp_path


# ------------------------------------------------------------------------------------------------ readers
def same_series(actual: list[tuple[int, float]], expected: list[tuple[int, float]]) -> bool:
    """Same steps, values equal up to float32 rounding."""
    return [s for s, _ in actual] == [s for s, _ in expected] and [v for _, v in actual] == pytest.approx(
        [v for _, v in expected], rel=1e-6
    )


def tb_reader(log_dir: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"tensors": 0, "scalars": 0})
    acc.Reload()
    return acc


def tb_scalars(acc, tag: str) -> list[tuple[int, float]]:
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def tb_texts(acc, tag: str) -> dict[int, str]:
    return {e.step: e.tensor_proto.string_val[0].decode() for e in acc.Tensors(f"{tag}/text_summary")}


def wandb_records(wandb_dir: Path) -> list:
    """The records of the one offline run under ``wandb_dir`` (its ``.wandb`` file: a LevelDB-style log of
    protobuf records after a 7-byte W&B header, in 32 KiB blocks)."""
    from wandb.proto import wandb_internal_pb2

    (path,) = Path(wandb_dir).glob("wandb/offline-run-*/run-*.wandb")
    data, pos, block, chunk, records = path.read_bytes(), 7, 32768, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # block trailer padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunk)
            records.append(record)
            chunk = b""
    return records


def wandb_history(records, key: str) -> list[tuple[int, float]]:
    out = []
    for record in records:
        if record.WhichOneof("record_type") == "history":
            items = {"/".join(i.nested_key) or i.key: i.value_json for i in record.history.item}
            if key in items:
                out.append((int(json.loads(items["_step"])), json.loads(items[key])))
    return out


def wandb_tables(records, wandb_dir: Path, key: str) -> dict[int, dict]:
    """``{step: the table's json}`` for the tables logged under ``key`` (found through the history rows)."""
    (files,) = Path(wandb_dir).glob("wandb/offline-run-*/files")
    return {step: json.loads((files / path).read_text()) for step, path in wandb_history(records, f"{key}/path")}


def wandb_config(records) -> dict:
    config = {}
    for record in records:
        kind = record.WhichOneof("record_type")
        updates = record.run.config.update if kind == "run" else record.config.update if kind == "config" else []
        for item in updates:
            config["/".join(item.nested_key) or item.key] = json.loads(item.value_json)
    return config


def mlflow_run(uri: str, experiment: str):
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    return client, run


def mlflow_json(client, run_id: str, path: str, dest: Path):
    return json.loads(Path(client.download_artifacts(run_id, path, str(dest))).read_text())


# ------------------------------------------------------------------------------------------------ unit tests
def test_importing_does_not_import_optional_trackers():
    code = (
        "import sys, verl.utils.tracking\n"
        "print([m for m in ('wandb', 'mlflow', 'tensorboard', 'torch.utils.tensorboard') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_console_and_file(in_tmp, console_messages):
    tracker = Tracking("proj", "exp", ["console", "file"], config=CONFIG)
    tracker.log({"a": np.float32(0.5), "b": torch.tensor(2.0), "n": np.int64(3), "bad": float("nan"), "s": "x"}, 1)
    tracker.log({"a": 1.0}, step=2, backend="file")  # only to the file
    tracker.finish()
    tracker.finish()  # harmless
    lines = [json.loads(line) for line in (in_tmp / "proj" / "exp.jsonl").read_text().splitlines()]
    assert lines[0] == {"step": 0, "data": {}, "config": CONFIG}  # config first; readers doing r["data"] still work
    assert lines[1] == {"step": 1, "data": {"a": 0.5, "b": 2.0, "n": 3.0, "bad": "nan", "s": "x"}}
    assert lines[2] == {"step": 2, "data": {"a": 1.0}}
    assert any("resolved config" in m and "total_training_steps: 3" in m for m in console_messages)
    steps = [m for m in console_messages if m.startswith("step:")]
    assert steps == ["step:1 - a:0.5 - b:2 - bad:nan - n:3 - s:x"]


def test_file_path_from_env_and_val_generations_next_to_it(in_tmp, monkeypatch, console_messages):
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(in_tmp / "out" / "metrics.jsonl"))
    tracker = Tracking("proj", "exp", ["file", "console"])
    ValidationGenerationsLogger("proj", "exp").log(["file", "console", "swanlab"], SAMPLES, step=4)
    tracker.finish()
    assert (in_tmp / "out" / "metrics.jsonl").exists()
    (record,) = [json.loads(x) for x in (in_tmp / "out" / "metrics.val_generations.jsonl").read_text().splitlines()]
    assert record == {
        "step": 4,
        "val_generations": [
            {"input": "1+1=", "output": "2", "score": 1.0},
            {"input": "a | b\nc", "output": "out", "score": 0.0},
        ],
    }
    assert any("step 4, sample 2" in m and "a | b\nc" in m for m in console_messages)


def test_tensorboard_scalars_config_and_val_generations(in_tmp, monkeypatch):
    monkeypatch.setenv("TENSORBOARD_DIR", str(in_tmp / "tb"))
    tracker = Tracking("proj", "exp", ["tensorboard"], config=CONFIG)
    for step in (1, 2):
        tracker.log({"critic/score/mean": np.float64(step / 10), "note": "text", "flag": True}, step)
    ValidationGenerationsLogger("proj", "exp").log(["tensorboard"], SAMPLES, step=2)  # into the open writer
    tracker.finish()
    tracker.finish()
    acc = tb_reader(in_tmp / "tb")
    assert same_series(tb_scalars(acc, "critic/score/mean"), [(1, 0.1), (2, 0.2)])
    assert acc.Tags()["scalars"] == ["critic/score/mean"]  # non-numeric values skipped
    assert "total_training_steps: 3" in tb_texts(acc, "config")[0]
    table = tb_texts(acc, "val/generations")[2]
    assert "| 2 | a \\| b<br>c | out | 0.0 |" in table

    # no TENSORBOARD_DIR: veRL's tensorboard_log/<project>/<experiment>; no live tracker: a writer of its own
    monkeypatch.delenv("TENSORBOARD_DIR")
    ValidationGenerationsLogger("proj", "exp").log(["tensorboard"], SAMPLES[:1], step=5)
    assert (
        "| 1 | 1+1= | 2 | 1.0 |"
        in tb_texts(tb_reader(in_tmp / "tensorboard_log" / "proj" / "exp"), "val/generations")[5]
    )


def test_wandb_defaults_to_offline_and_writes_the_run(in_tmp, caplog):
    caplog.set_level(logging.INFO, logger="verl.utils.tracking")
    with pytest.warns(DeprecationWarning, match="'tracking' is deprecated"):
        tracker = Tracking("proj", "exp", ["tracking", "wandb"], config=CONFIG)  # alias → one wandb backend
    assert list(tracker.loggers) == ["wandb"]
    assert "offline" in caplog.text and "wandb sync" in caplog.text
    filtered = DapoFilteredRewardTableLogger("proj", "exp")
    for step in (1, 2, 3):
        tracker.log({"critic/score/mean": np.float32(step / 4), "val-core/x/reward/mean@4": 0.5}, step)
        ValidationGenerationsLogger("proj", "exp").log(["wandb"], SAMPLES[: 1 + step % 2], step)  # new logger each time
        filtered.log(["console", "wandb"], {1.0: step, np.float32(0.0): 2}, step)
    tracker.finish(exit_code=1)  # a failed run
    tracker.finish()
    records = wandb_records(in_tmp / "wandb")
    assert [r.exit.exit_code for r in records if r.WhichOneof("record_type") == "exit"] == [1]
    # the filtered-reward table takes one row per step (wandb 0.20+: each step's file holds its new rows)
    increments = wandb_tables(records, in_tmp / "wandb", "training/filter_groups/filtered_reward_counts")
    assert [row for step in sorted(increments) for row in increments[step]["data"]] == [
        [1, "0:2, 1:1"],
        [2, "0:2, 1:2"],
        [3, "0:2, 1:3"],
    ]
    assert wandb_history(records, "critic/score/mean") == [(1, 0.25), (2, 0.5), (3, 0.75)]
    assert wandb_history(records, "val-core/x/reward/mean@4") == [(1, 0.5), (2, 0.5), (3, 0.5)]
    config = wandb_config(records)
    assert config["trainer"]["total_training_steps"] == 3 and config["algorithm"] == {"gamma": 1.0}
    # the table accumulates one row per step, padded to the widest step (2 samples)
    tables = wandb_tables(records, in_tmp / "wandb", "val/generations")
    assert sorted(tables) == [1, 2, 3]
    table = tables[3]
    assert table["columns"] == ["step", "input_1", "output_1", "score_1", "input_2", "output_2", "score_2"]
    assert [row[0] for row in table["data"]] == [1, 2, 3]
    assert table["data"][1] == [2, "1+1=", "2", 1.0, None, None, None]
    assert table["data"][2] == [3, "1+1=", "2", 1.0, "a | b\nc", "out", 0.0]


@pytest.mark.filterwarnings("ignore::DeprecationWarning:mlflow.*")  # sqlalchemy's, raised inside mlflow
def test_mlflow_metrics_params_config_and_val_generations(in_tmp, monkeypatch):
    uri = f"sqlite:///{in_tmp / 'ml' / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    config = {**CONFIG, "long": "x" * 10_000, "bad key@": [1, 2]}
    tracker = Tracking("proj", "exp", ["mlflow"], config=config)
    for step in (1, 2):
        tracker.log({"val-core/x/reward/mean@4": np.float32(step / 2), "critic/score/mean": 0.1 * step, "s": "x"}, step)
    ValidationGenerationsLogger("proj", "exp").log(["mlflow"], SAMPLES, step=2)  # into the active run
    tracker.finish()
    tracker.finish()
    client, run = mlflow_run(uri, "proj")
    assert run.info.run_name == "exp" and run.info.status == "FINISHED"
    history = client.get_metric_history(run.info.run_id, mlflow_key("val-core/x/reward/mean@4"))
    assert [(m.step, m.value) for m in history] == [(1, 0.5), (2, 1.0)]
    assert mlflow_key("val-core/x/reward/mean@4") == "val-core/x/reward/mean_at_4"
    assert set(run.data.metrics) == {"val-core/x/reward/mean_at_4", "critic/score/mean"}
    params = run.data.params
    assert params["trainer.total_training_steps"] == "3" and params["trainer.logger"] == '["x"]'
    assert params["bad key_at_"] == "[1, 2]"
    assert len(params["long"]) <= 6000 and params["long"].endswith("...[truncated]")
    assert mlflow_json(client, run.info.run_id, "config.json", in_tmp / "dl") == config  # whole, not truncated
    samples = mlflow_json(client, run.info.run_id, "val_generations/step_00000002.json", in_tmp / "dl")
    assert samples["step"] == 2 and samples["samples"][1] == {"input": "a | b\nc", "output": "out", "score": 0.0}
    assert (in_tmp / "ml" / "mlruns").is_dir()  # artifacts next to the local store
    Tracking("failed", "exp", ["mlflow"]).finish(exit_code=1)
    assert mlflow_run(uri, "failed")[1].info.status == "FAILED"


def test_trackio_metrics_config_val_generations_and_traces(in_tmp):
    """trackio (its local store: TRACKIO_DIR, set for the session by tests/conftest.py) read back with its own
    storage reader and trace files."""
    from trackio.sqlite_storage import SQLiteStorage
    from trackio.utils import TRACKIO_DIR

    project = f"verl-{in_tmp.name}"  # the store is the session's
    tracker = Tracking(project, "exp", ["trackio"], config=CONFIG)
    for step in (1, 2):
        tracker.log({"critic/score/mean": np.float32(step / 4), "val-core/x/reward/mean@4": 0.5}, step)
    ValidationGenerationsLogger(project, "exp").log(["trackio"], SAMPLES, step=2)
    tracker.finish()
    tracker.finish()
    logs = SQLiteStorage.get_logs(project, "exp")
    assert [(r["step"], r["critic/score/mean"]) for r in logs if "critic/score/mean" in r] == [(1, 0.25), (2, 0.5)]
    assert SQLiteStorage.get_run_config(project, "exp")["trainer"]["total_training_steps"] == 3
    traces = trackio_traces(Path(TRACKIO_DIR) / "traces" / project / "exp")
    assert [(t["step"], t["messages"]) for t in traces] == [
        (2, [("user", "1+1="), ("assistant", "2")]),
        (2, [("user", "a | b\nc"), ("assistant", "out")]),
    ]
    assert [t["metadata"]["score"] for t in traces] == [1.0, 0.0]


def trackio_traces(folder: Path) -> list[dict]:
    """The traces trackio wrote under ``folder`` (one jsonl session per trace), by step and place in their log call."""
    out = []
    for path in folder.glob("*.jsonl"):
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        session = lines[0]["trackio"]
        messages = [
            (m["message"]["role"], "".join(part["text"] for part in m["message"]["content"]))
            for m in lines[1:]
            if m["type"] == "message"
        ]
        out.append(
            {
                "index": session["trace_index"],
                "step": session["step"],
                "metadata": session["metadata"],
                "messages": messages,
            }
        )
    out.sort(key=lambda t: (t["step"] is None, t["step"] or 0, t["index"] or 0))
    return [{k: v for k, v in t.items() if k != "index"} for t in out]


def test_mlflow_names_and_default_store(in_tmp):
    from mlflow.utils.validation import _validate_metric_name

    keys = ["val-core/x/reward/mean@4", "a//b/", "/lead", "x/../y", "w(e)i*rd", "é/ok"]
    names = [mlflow_key(k) for k in keys]
    assert names == ["val-core/x/reward/mean_at_4", "a/b", "lead", "x/__/y", "w_e_i_rd", "é/ok"]
    assert [mlflow_key(k) for k in keys] == names  # deterministic
    for name in names:
        _validate_metric_name(name)  # raises on a name MLflow refuses
    assert default_mlflow_uri() == f"sqlite:///{in_tmp / 'mlflow.db'}"  # MLflow 3's default, made absolute


@pytest.mark.parametrize("backend, module", [("wandb", "wandb"), ("mlflow", "mlflow"), ("tensorboard", "tensorboard")])
def test_missing_package_fails_at_start_naming_the_extra(in_tmp, monkeypatch, backend, module):
    monkeypatch.setitem(sys.modules, module, None)  # simulates the package being absent: importing it fails
    with pytest.raises(ImportError, match=rf"'{backend}' needs the '{module}' package.*pip install 'verl\[trackers\]'"):
        Tracking("proj", "exp", ["file", backend], config=CONFIG)
    assert not (in_tmp / "proj").exists()  # checked before any backend opened
    with pytest.raises(ImportError, match=r"pip install 'verl\[trackers\]'"):  # val generations need it too
        ValidationGenerationsLogger("proj", "exp").log([backend], SAMPLES, step=1)


@pytest.mark.parametrize(
    "name, message",
    [
        ("swanlab", "trainer.logger backend 'swanlab' is not supported by this verl"),
        ("vemlp_wandb", "trainer.logger backend 'vemlp_wandb' is not supported"),
        ("tensorbord", "unknown trainer.logger backend 'tensorbord'"),
    ],
)
def test_unknown_or_unshipped_backend(in_tmp, name, message):
    with pytest.raises(ValueError, match=message) as err:
        Tracking("proj", "exp", ["file", name])
    assert "available: console, file, mlflow, tensorboard, trackio, wandb" in str(err.value)
    assert not (in_tmp / "proj").exists()
    assert set(Tracking.supported_backend) >= {"console", "file", "tensorboard", "wandb", "mlflow"}


# ------------------------------------------------------------------------------------------------ the real trainer
@pytest.fixture
def run(cli_runs):
    return real_run(cli_runs)


@pytest.mark.slow
@needs(RUN)
def test_real_trainer_run_reaches_every_backend(run):
    assert run.returncode == 0, run.output[-4000:]
    assert "Traceback" not in run.output, run.output[-4000:]
    records = [json.loads(line) for line in run.jsonl.read_text().splitlines()]
    # file: the config line, then the steps
    assert records[0]["data"] == {} and records[0]["config"]["trainer"]["logger"] == list(BACKENDS)
    scores = [(r["step"], r["data"]["critic/score/mean"]) for r in records if "critic/score/mean" in r["data"]]
    assert [s for s, _ in scores] == list(range(1, STEPS + 1))
    val_key = next(k for k in records[-1]["data"] if k.startswith("val-core/") and "@" in k)
    # console: config once, then one line per step
    assert run.output.count("resolved config") == 1 and f"step:{STEPS} - " in run.output
    # tensorboard
    acc = tb_reader(run.tensorboard_dir)
    assert same_series(tb_scalars(acc, "critic/score/mean"), scores)
    assert f"total_training_steps: {STEPS}" in tb_texts(acc, "config")[0]
    assert STEPS in tb_texts(acc, "val/generations")
    # wandb (offline)
    wb = wandb_records(run.wandb_dir)
    assert same_series(wandb_history(wb, "critic/score/mean"), scores)
    assert wandb_config(wb)["trainer"]["total_training_steps"] == STEPS
    (table,) = wandb_tables(wb, run.wandb_dir, "val/generations").values()
    assert table["data"][0][0] == STEPS and len(table["columns"]) == 1 + 3 * VAL_SAMPLES
    # mlflow
    client, ml = mlflow_run(run.mlflow_uri, records[0]["config"]["trainer"]["project_name"])
    history = client.get_metric_history(ml.info.run_id, "critic/score/mean")
    assert same_series([(m.step, m.value) for m in history], scores)
    assert mlflow_key(val_key) in ml.data.metrics  # the '@' key, renamed
    assert ml.data.params["trainer.total_training_steps"] == str(STEPS)
    assert mlflow_json(client, ml.info.run_id, "config.json", run.root / "dl") == records[0]["config"]
    val = mlflow_json(client, ml.info.run_id, f"val_generations/step_{STEPS:08d}.json", run.root / "dl")
    assert len(val["samples"]) == VAL_SAMPLES
    # the file backend's val generations
    (val_line,) = [json.loads(x) for x in run.val_jsonl.read_text().splitlines()]
    assert val_line["step"] == STEPS and len(val_line["val_generations"]) == VAL_SAMPLES
