"""Validation statistics (mean@N, bootstrapped best/worst/maj@K) against plain per-resample loops, and the
val-core / val-aux naming, generation picking and jsonl dumps."""

from __future__ import annotations

import json
from functools import partial

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verl.trainer.ppo.metric_utils import bootstrap_metric, calc_maj_val, process_validation_metrics
from verl.trainer.ppo.validation import dump_generations, pick_generations, validation_metrics


def loop_bootstrap(values, k, reduce_fn, n_bootstrap=1000, seed=42):
    """One resample at a time, the same draws as the library (numpy's default generator, ``integers``)."""
    rng = np.random.default_rng(seed)
    index = rng.integers(0, len(values), size=(n_bootstrap, k))
    stats = []
    for row in index:
        stats.append(reduce_fn([values[i] for i in row]))
    return float(np.mean(stats)), float(np.std(stats))


def loop_majority(items):
    """Majority vote, written out: count each prediction; ties go to the one that appears first."""
    best, best_count = None, -1
    for item in items:
        count = sum(1 for other in items if other["pred"] == item["pred"])
        if count > best_count:
            best, best_count = item, count
    return best["acc"]


def test_bootstrap_metric_matches_a_loop():
    values = [0.0, 1.0, 0.5, 0.25, 1.0]
    for k in (1, 2, 5):
        (mean, std), (wmean, wstd) = bootstrap_metric(values, k, [np.max, np.min])
        assert (mean, std) == pytest.approx(loop_bootstrap(values, k, max), abs=1e-12)
        assert (wmean, wstd) == pytest.approx(loop_bootstrap(values, k, min), abs=1e-12)
    # more samples in the subset can only raise the expected best
    assert bootstrap_metric(values, 4, [np.max])[0][0] > bootstrap_metric(values, 2, [np.max])[0][0]


def test_calc_maj_val_breaks_ties_by_first_seen():
    data = [{"pred": "3", "acc": 0.0}, {"pred": "4", "acc": 1.0}, {"pred": "4", "acc": 1.0}, {"pred": "3", "acc": 0.0}]
    assert calc_maj_val(data, "pred", "acc") == 0.0  # 2 vs 2: "3" came first
    assert calc_maj_val(data[1:], "pred", "acc") == 1.0


@settings(max_examples=30, deadline=None)
@given(
    st.lists(
        st.lists(st.tuples(st.sampled_from("abc"), st.sampled_from([0.0, 0.5, 1.0])), min_size=1, max_size=9),
        min_size=1,
        max_size=4,
    )
)
def test_process_validation_metrics_matches_per_prompt_loops(groups):
    sources, uids, acc, preds = [], [], [], []
    for g, samples in enumerate(groups):
        for pred, value in samples:
            sources.append("src")
            uids.append(f"u{g}")
            preds.append(pred)
            acc.append(value)
    out = process_validation_metrics(sources, uids, {"acc": acc, "pred": preds}, n_bootstrap=200)["src"]["acc"]
    expected: dict[str, list[float]] = {}
    for samples in groups:
        values = [v for _, v in samples]
        items = [{"pred": p, "acc": v} for p, v in samples]
        n = len(values)
        per = {f"mean@{n}": float(np.mean(values))}
        if n > 1:
            per[f"std@{n}"] = float(np.std(values))
            for k in sorted({2**i for i in range(1, 4) if 2**i < n} | {n}):
                per[f"best@{k}/mean"], per[f"best@{k}/std"] = loop_bootstrap(values, k, max, 200)
                per[f"worst@{k}/mean"], per[f"worst@{k}/std"] = loop_bootstrap(values, k, min, 200)
                per[f"maj@{k}/mean"], per[f"maj@{k}/std"] = loop_bootstrap(items, k, loop_majority, 200)
        for name, value in per.items():
            expected.setdefault(name, []).append(value)
    assert set(out) == set(expected)
    for name, values in expected.items():
        assert out[name] == pytest.approx(float(np.mean(values)), abs=1e-9), name


def test_maj_agrees_with_bootstrap_metric_over_dicts():
    preds = ["1", "2", "2", "1", "3", "1"]
    acc = [1.0, 0.0, 0.0, 1.0, 0.0, 1.0]
    out = process_validation_metrics(["s"] * 6, ["u"] * 6, {"acc": acc, "pred": preds})["s"]["acc"]
    items = [{"pred": p, "acc": a} for p, a in zip(preds, acc)]
    ((mean, std),) = bootstrap_metric(items, 4, [partial(calc_maj_val, vote_key="pred", val_key="acc")])
    assert (out["maj@4/mean"], out["maj@4/std"]) == pytest.approx((mean, std), abs=1e-12)


def test_single_sample_and_constant_groups():
    out = process_validation_metrics(["s", "s"], ["a", "b"], {"reward": [0.2, 0.6]})["s"]["reward"]
    assert out == {"mean@1": pytest.approx(0.4)}
    out = process_validation_metrics(["s"] * 3, ["a"] * 3, {"reward": [0.7] * 3})["s"]["reward"]
    for name in ("mean@3", "best@2/mean", "best@3/mean", "worst@3/mean"):
        assert out[name] == pytest.approx(0.7)
    assert out["std@3"] == pytest.approx(0.0, abs=1e-12) and out["best@3/std"] == pytest.approx(0.0, abs=1e-12)
    assert not any(name.startswith("maj@") for name in out)  # no "pred": no majority vote


def test_sources_are_separate_and_non_numeric_infos_are_skipped():
    out = process_validation_metrics(
        ["a", "a", "b", "b"], ["1", "1", "2", "2"], {"reward": [0, 1, 1, 1], "note": ["x", "y", "z", "w"]}
    )
    assert set(out) == {"a", "b"} and set(out["a"]) == {"reward"}
    assert out["a"]["reward"]["mean@2"] == 0.5 and out["b"]["reward"]["mean@2"] == 1.0


def test_mismatched_lengths_are_refused():
    with pytest.raises(ValueError, match="'acc' has 1 entries for 2 samples"):
        process_validation_metrics(["s", "s"], ["u", "u"], {"acc": [1.0]})
    with pytest.raises(ValueError, match="1 data sources for 2 samples"):
        process_validation_metrics(["s"], ["u", "u"], {})


def test_core_and_aux_names():
    n = 5
    infos = {"reward": [0.1, 0.9, 0.5, 0.5, 0.3], "acc": [0, 1, 1, 1, 0], "pred": list("abbba")}
    out = validation_metrics(["gsm8k"] * n, ["u"] * n, infos)
    core = sorted(k for k in out if k.startswith("val-core/"))
    assert core == ["val-core/gsm8k/acc/best@5/mean", "val-core/gsm8k/acc/maj@5/mean", "val-core/gsm8k/acc/mean@5"]
    for name in (
        "reward/mean@5",
        "acc/std@5",
        "acc/best@5/std",
        "acc/best@2/mean",
        "acc/best@4/mean",
        "acc/maj@2/mean",
    ):
        assert f"val-aux/gsm8k/{name}" in out, name
    assert out["val-core/gsm8k/acc/mean@5"] == pytest.approx(0.6)
    assert (
        out["val-core/gsm8k/acc/best@5/mean"]
        >= out["val-core/gsm8k/acc/mean@5"]
        >= out["val-aux/gsm8k/acc/worst@5/mean"]
    )
    # without acc the reward is the core variable
    out = validation_metrics(["s"] * 2, ["u"] * 2, {"reward": [0.0, 1.0]})
    assert "val-core/s/reward/mean@2" in out and "val-aux/s/reward/std@2" in out


def test_pick_generations_is_deterministic_and_sorted_by_input_first():
    inputs = [f"q{i}" for i in range(10)]
    outputs = [f"a{i}" for i in range(10)]
    first = pick_generations(inputs, outputs, list(range(10)), 4)
    again = pick_generations(list(reversed(inputs)), list(reversed(outputs)), list(reversed(range(10))), 4)
    assert first == again and len(first) == 4
    assert all(out == f"a{inp[1:]}" and score == float(inp[1:]) for inp, out, score in first)


def test_dump_generations_writes_one_line_per_sample(tmp_path):
    path = dump_generations(
        str(tmp_path / "dumps"),
        3,
        ["q1", "q2"],
        ["a1", "a2"],
        ["1", None],
        [1.0, 0.0],
        {"acc": np.array([1.0, 0.0]), "short": [1]},
    )
    rows = [json.loads(line) for line in open(path)]
    assert path.endswith("3.jsonl") and len(rows) == 2
    assert rows[0] == {"input": "q1", "output": "a1", "gts": "1", "score": 1.0, "step": 3, "acc": 1.0}
    assert "short" not in rows[1]  # a list of another length is left out
