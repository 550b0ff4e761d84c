"""verl.utils.plot: reading veRL jsonl, the figure's panels, the CLI (errors, exit codes), and the curves of a real
trainer run (the run shared with test_tracking.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli_runs import needs
from tests.utils._real_run import RUN, STEPS, real_run
from verl.utils.plot import DPI, FIGSIZE, PANELS, RunFileError, main, make_figure, plot_runs, read_run
from verl.utils.tracking import Tracking

HEIGHT, WIDTH = int(FIGSIZE[1] * DPI), int(FIGSIZE[0] * DPI)


def write_run(path: Path, steps: int, keys: dict[str, float], config: dict | None = None) -> Path:
    """A jsonl written by the real ``file`` tracker (config line included) with ``keys`` growing per step."""
    previous = os.environ.get("VERL_FILE_LOGGER_PATH")
    os.environ["VERL_FILE_LOGGER_PATH"] = str(path)
    try:
        tracker = Tracking("p", path.stem, "file", config=config or {"trainer": {"total_training_steps": steps}})
        for step in range(1, steps + 1):
            tracker.log({key: base + step / 10 for key, base in keys.items()} | {"note": "text"}, step)
        tracker.finish()
    finally:
        if previous is None:
            del os.environ["VERL_FILE_LOGGER_PATH"]
        else:
            os.environ["VERL_FILE_LOGGER_PATH"] = previous
    return path


FULL = {
    "critic/score/mean": 0.0,
    "response_length/mean": 5.0,
    "response_length/min": 1.0,
    "response_length/max": 8.0,
    "actor/pg_loss": 0.1,
    "actor/entropy": 5.0,
    "actor/ppo_kl": 0.0,
    "timing_s/step": 1.0,
    "timing_s/gen": 0.5,
    "val-core/x/reward/mean@1": 0.2,
}


def panel(fig, title: str):
    return next(ax for ax in fig.axes if ax.get_title() == title)


def texts(ax) -> list[str]:
    return [t.get_text() for t in ax.texts]


def legend(ax) -> list[str]:
    return [t.get_text() for t in ax.get_legend().get_texts()] if ax.get_legend() else []


def image_stats(path: Path) -> tuple[tuple[int, ...], float]:
    import matplotlib.image

    pixels = matplotlib.image.imread(str(path))
    return pixels.shape, float(pixels[..., :3].var())


def test_read_run_skips_lines_without_numbers(tmp_path):
    path = write_run(tmp_path / "a.jsonl", 3, {"critic/score/mean": 0.0})
    with path.open("a") as f:
        f.write('{"step": 4, "val_generations": []}\n\n{"step": 5, "data": {"x": "str", "y": null}}\n')
    run = read_run(path)
    assert run.label == "a"
    assert run.series == {"critic/score/mean": [(1.0, 0.1), (2.0, 0.2), (3.0, 0.3)]}


@pytest.mark.parametrize(
    "line, message",
    [("{not json", "not valid JSON"), ("[1, 2]", "expected a JSON object"), ('{"data": {"a": 1}}', "'step'")],
)
def test_malformed_line_names_file_and_line(tmp_path, capsys, line, message):
    path = write_run(tmp_path / "bad.jsonl", 2, {"critic/score/mean": 0.0})
    with path.open("a") as f:
        f.write(line + "\n")
    with pytest.raises(RunFileError, match=rf"bad\.jsonl:4: {message}"):
        read_run(path)
    with pytest.raises(SystemExit) as exit_info:  # the CLI: an argparse-style error
        main([str(path), "-o", str(tmp_path / "x.png")])
    assert exit_info.value.code == 2
    assert f"{path}:4: {message}" in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()


def test_two_runs_overlaid_and_missing_panels_say_not_logged(tmp_path):
    full = write_run(tmp_path / "full.jsonl", 4, FULL)
    score_only = write_run(tmp_path / "score_only.jsonl", 2, {"critic/score/mean": 0.5})
    fig = make_figure([full, score_only], title="compare")
    assert fig._suptitle.get_text() == "compare"
    assert [ax.get_title() for ax in fig.axes[: len(PANELS)]] == [title for title, _, _ in PANELS]
    score = panel(fig, "score")
    assert legend(score) == [
        "critic/score/mean (full)",
        "val-core/x/reward/mean@1 (full)",
        "critic/score/mean (score_only)",
    ]
    assert [len(line.get_xdata()) for line in score.get_lines()] == [4, 4, 2]
    assert legend(panel(fig, "response length")) == ["response_length/mean (full)", "min-max (full)"]
    assert legend(panel(fig, "losses")) == ["actor/pg_loss (full)", "actor/entropy (full)"]
    assert legend(panel(fig, "step time")) == ["timing_s/step (full)", "timing_s/gen (full)"]
    assert texts(panel(fig, "KL")) == []

    fig = make_figure([score_only])  # one run: keys as labels; panels without data say so
    assert legend(panel(fig, "score")) == ["critic/score/mean"]
    for title in ("response length", "losses", "KL", "step time"):
        assert texts(panel(fig, title)) == ["not logged"], title


def test_cli_writes_a_png(tmp_path):
    run = write_run(tmp_path / "run.jsonl", 5, FULL)
    assert main([str(run), "-o", str(tmp_path / "out" / "c.png"), "--title", "t"]) == 0
    shape, variance = image_stats(tmp_path / "out" / "c.png")
    assert shape[:2] == (HEIGHT, WIDTH) and variance > 1e-3


def test_missing_matplotlib_names_the_extra(tmp_path, monkeypatch, capsys):
    run = write_run(tmp_path / "run.jsonl", 2, FULL)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # simulates matplotlib being absent: importing it fails
    with pytest.raises(ImportError, match=r"pip install 'verl\[plot\]'"):
        plot_runs([run], tmp_path / "c.png")
    assert main([str(run), "-o", str(tmp_path / "c.png")]) == 1
    assert "pip install 'verl[plot]'" in capsys.readouterr().err
    assert not (tmp_path / "c.png").exists()


# ------------------------------------------------------------------------------------------------ the real run
@pytest.fixture
def run(cli_runs):
    return real_run(cli_runs)


@pytest.mark.slow
@needs(RUN)
def test_plot_cli_on_a_real_run(run, tmp_path):
    assert run.returncode == 0, run.output[-4000:]
    out = tmp_path / "curves.png"
    proc = subprocess.run(
        [sys.executable, "-m", "verl.utils.plot", str(run.jsonl), "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    shape, variance = image_stats(out)
    assert shape[:2] == (HEIGHT, WIDTH) and variance > 1e-3  # drawn, not blank

    fig = make_figure([run.jsonl])  # what the PNG shows
    score = panel(fig, "score")
    assert list(score.get_lines()[0].get_xdata()) == list(range(1, STEPS + 1))
    assert any(label.startswith("val-core/") for label in legend(score))  # the last step's validation
    for title in ("score", "response length", "losses", "KL", "step time"):
        assert texts(panel(fig, title)) == [], title
    assert "timing_s/gen" in legend(panel(fig, "step time"))
    first = json.loads(run.jsonl.read_text().splitlines()[0])
    assert "config" in first  # the config line is in the file, and the plot skipped it
