"""Training curves from veRL jsonl metric files (the ``file`` logger's output).

``python -m verl.utils.plot run.jsonl [other.jsonl ...] -o curves.png [--title TITLE]`` draws one figure with
panels for the score (``critic/score/mean``, ``val-core/*`` as markers), the response length (mean, with a min/max
band), the losses, the KL terms and the step time (``timing_s/step`` and the main stages). Several files are
several runs overlaid, each labelled with its file stem. A panel whose keys no run logged says "not logged".

Lines are ``{"step": N, "data": {...}}``; lines without numeric data (e.g. the config line) are skipped, a line
that is not a JSON object is an error naming the file and line. Needs matplotlib: ``pip install 'verl[plot]'``;
drawing uses the Agg canvas directly, so the caller's pyplot backend is left alone.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["PANELS", "Run", "RunFileError", "main", "make_figure", "plot_runs", "read_run"]

PLOT_EXTRA = "pip install 'verl[plot]'"
FIGSIZE = (16.0, 9.0)  # inches
DPI = 100  # → a 1600 x 900 PNG

STAGES = (
    "timing_s/gen",
    "timing_s/reward",
    "timing_s/old_log_prob",
    "timing_s/ref",
    "timing_s/values",
    "timing_s/adv",
    "timing_s/update_critic",
    "timing_s/update_actor",
    "timing_s/update_weights",
    "timing_s/testing",
)
# (title, y label, keys drawn as lines)
PANELS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("score", "score", ("critic/score/mean",)),
    ("response length", "tokens", ("response_length/mean",)),
    ("losses", "loss", ("actor/pg_loss", "critic/vf_loss", "actor/kl_loss", "actor/entropy")),
    ("KL", "KL", ("actor/ppo_kl", "actor/kl_loss", "actor/reward_kl_penalty")),
    ("step time", "seconds", ("timing_s/step", *STAGES)),
)
LINESTYLES = ("-", "--", ":", "-.")


class RunFileError(ValueError):
    """A metrics file that cannot be read (its path and line are in the message)."""


@dataclass
class Run:
    """One run's metrics: ``series[key]`` is a list of ``(step, value)`` in file order."""

    label: str
    series: dict[str, list[tuple[float, float]]] = field(default_factory=dict)

    def get(self, key: str) -> tuple[list[float], list[float]]:
        points = self.series.get(key, [])
        return [p[0] for p in points], [p[1] for p in points]


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def read_run(path: str | Path, label: str | None = None) -> Run:
    """Read a veRL jsonl file into a :class:`Run` (raises :class:`RunFileError` on a malformed line)."""
    path = Path(path)
    run = Run(label or path.stem)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as err:
        raise RunFileError(f"{path}: cannot read: {err.strerror or err}") from err
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise RunFileError(f"{path}:{lineno}: not valid JSON ({err.msg})") from err
        if not isinstance(record, dict):
            raise RunFileError(f"{path}:{lineno}: expected a JSON object with 'step' and 'data'")
        data = record.get("data")
        if not isinstance(data, dict):
            continue
        numbers = {key: v for key, value in data.items() if (v := _number(value)) is not None}
        if not numbers:
            continue
        step = _number(record.get("step"))
        if step is None:
            raise RunFileError(f"{path}:{lineno}: 'step' is missing or not a number")
        for key, value in numbers.items():
            run.series.setdefault(key, []).append((step, value))
    return run


def _labels(paths: Sequence[Path]) -> list[str]:
    """File stems; stems shared by several files get their parent folder's name in front."""
    stems = [p.stem for p in paths]
    return [f"{p.parent.name}/{p.stem}" if stems.count(p.stem) > 1 else p.stem for p in paths]


def _import_matplotlib() -> tuple[Any, Any]:
    try:
        importlib.import_module("matplotlib")
        figure = importlib.import_module("matplotlib.figure")
        backend_agg = importlib.import_module("matplotlib.backends.backend_agg")
    except ImportError as err:
        raise ImportError(f"plotting needs matplotlib, which is not installed: {PLOT_EXTRA}") from err
    return figure, backend_agg


# Keys drawn against a right-hand axis in their panel (their scale dwarfs the others').
SECONDARY = frozenset({"actor/entropy"})


def _label(key: str, run: Run, several: bool) -> str:
    return f"{key} ({run.label})" if several else key


def _draw_panel(ax: Any, title: str, ylabel: str, keys: tuple[str, ...], runs: list[Run]) -> None:
    """Lines for ``keys`` (color per key, line style per run; one key → color per run), extras per panel."""
    from matplotlib.ticker import MaxNLocator

    several = len(runs) > 1
    right = None
    handles: list[Any] = []
    for r, run in enumerate(runs):
        style = LINESTYLES[r % len(LINESTYLES)]
        present = [key for key in keys if key in run.series]
        for k, key in enumerate(present):
            xs, ys = run.get(key)
            color = f"C{r % 10}" if len(keys) == 1 else f"C{k % 10}"
            target = ax
            if key in SECONDARY and len(present) > 1:
                right = right or ax.twinx()
                right.set_ylabel(", ".join(sorted(SECONDARY)))
                target = right
            marker = "." if len(xs) < 40 else None
            handles += target.plot(xs, ys, linestyle=style, color=color, marker=marker, label=_label(key, run, several))
        if title == "response length" and "response_length/min" in run.series and "response_length/max" in run.series:
            low, high = dict(run.series["response_length/min"]), dict(run.series["response_length/max"])
            steps = sorted(set(low) & set(high))
            band = ax.fill_between(
                steps, [low[s] for s in steps], [high[s] for s in steps], color=f"C{r % 10}", alpha=0.15
            )
            band.set_label(_label("min-max", run, several))
            handles.append(band)
        if title == "score":
            for v, key in enumerate(sorted(key for key in run.series if key.startswith("val-core/"))):
                xs, ys = run.get(key)
                color = f"C{(len(runs) + r + v) % 10}"
                marker = "os^vD"[v % 5]
                handles += ax.plot(
                    xs, ys, linestyle="none", marker=marker, color=color, label=_label(key, run, several)
                )
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    if handles:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(True, alpha=0.3)
        ax.legend(handles=handles, labels=[h.get_label() for h in handles], fontsize="x-small", loc="best")
    else:
        ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, color="gray")
        ax.set_xticks([])
        ax.set_yticks([])


def _summary(ax: Any, runs: list[Run]) -> None:
    """A text panel: per run, the steps logged and the last score."""
    ax.set_axis_off()
    lines = ["runs"]
    for run in runs:
        steps = {step for points in run.series.values() for step, _ in points}
        score = run.series.get("critic/score/mean")
        last = f", last score {score[-1][1]:.4g}" if score else ""
        span = f"steps {min(steps):g}-{max(steps):g}" if steps else "no numeric data"
        lines.append(f"{run.label}: {span}{last}")
    ax.text(0.02, 0.98, "\n".join(lines), va="top", ha="left", transform=ax.transAxes, family="monospace")


def make_figure(paths: Sequence[str | Path], title: str | None = None) -> Any:
    """The curves of the runs in ``paths`` as a matplotlib ``Figure`` on an Agg canvas (not saved)."""
    if not paths:
        raise ValueError("plotting needs at least one metrics file")
    paths = [Path(p) for p in paths]
    figure_mod, backend_agg = _import_matplotlib()
    runs = [read_run(p, label) for p, label in zip(paths, _labels(paths))]
    fig = figure_mod.Figure(figsize=FIGSIZE, dpi=DPI)
    backend_agg.FigureCanvasAgg(fig)
    axes = fig.subplots(2, 3).ravel()
    for ax, (panel_title, ylabel, keys) in zip(axes, PANELS):
        _draw_panel(ax, panel_title, ylabel, keys, runs)
    _summary(axes[len(PANELS)], runs)
    fig.suptitle(title or ", ".join(run.label for run in runs))
    fig.tight_layout()
    return fig


def plot_runs(paths: Sequence[str | Path], output: str | Path, title: str | None = None) -> Path:
    """Draw the runs in ``paths`` (veRL jsonl files) into the image ``output`` (format from its suffix)."""
    fig = make_figure(paths, title)
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=DPI)
    return output


def main(argv: Sequence[str] | None = None) -> int:
    """The CLI; returns 0, or exits with status 2 on a bad file (argparse style) and 1 without matplotlib."""
    parser = argparse.ArgumentParser(prog="python -m verl.utils.plot", description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="veRL jsonl metrics files (one per run)")
    parser.add_argument("-o", "--output", type=Path, default=Path("curves.png"), help="image to write")
    parser.add_argument("--title", default=None, help="figure title (default: the runs' names)")
    args = parser.parse_args(argv)
    try:
        output = plot_runs(args.runs, args.output, title=args.title)
    except RunFileError as err:
        parser.error(str(err))
    except ImportError as err:
        sys.stderr.write(f"error: {err}\n")
        return 1
    sys.stdout.write(f"{output}\n")  # the CLI's result: the image's path
    return 0


if __name__ == "__main__":
    sys.exit(main())
