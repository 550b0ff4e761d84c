"""The docs build and cannot drift from the code.

- the config reference is what ``scripts/generate_config_reference.py`` writes, lists every leaf key of the YAML,
  and the keys it marks as warned or refused (the unread table) are still unused by the code;
- ``scripts/build_docs.py`` renders every page with no broken link or anchor and no orphan page (and it does catch
  those);
- every registered advantage estimator and policy loss, KL estimator and loss-aggregation mode is in
  docs/algorithms.md;
- every metric name the code logs per training step (collected from the metric functions themselves, from the
  literal names in the modules that log, and from a short static list) matches a name in docs/metrics.md.

Fast: nothing here starts Ray or a trainer.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

# Namespaces of the per-step metric names.
METRIC_NAME = re.compile(
    r"^(training|actor|critic|perf|timing_s|timing_per_token_ms|global_seqlen|response_length|prompt_length|reward"
    r"|weight_sync|rollout_corr|val-core|val-aux)/[\w@./-]+$"
)

# Modules whose literal strings name metrics.
METRIC_MODULES = (
    "verl/trainer/ppo/ray_trainer.py",
    "verl/trainer/ppo/metric_utils.py",
    "verl/trainer/ppo/utils.py",
    "verl/algorithms/policy_losses.py",
    "verl/algorithms/cov_losses.py",
    "verl/algorithms/rollout_corr_helper.py",
    "verl/workers/actor/dp_actor.py",
    "verl/workers/critic/dp_critic.py",
    "verl/workers/fsdp_workers.py",
    "verl/workers/reward_manager/abstract.py",
    "verl/checkpoint_engine/base.py",
    "verl/utils/seqlen_balancing.py",
)

# Names logged every step that the functions below do not produce by themselves (the worker methods build them).
STATIC_METRICS = (
    "training/global_step",
    "training/epoch",
    "actor/pg_loss",
    "actor/entropy",
    "actor/kl_loss",
    "actor/kl_coef",
    "actor/grad_norm",
    "actor/lr",
    "perf/update_actor_seconds",
    "critic/vf_loss",
    "critic/vf_clipfrac",
    "critic/vpred_mean",
    "critic/grad_norm",
    "critic/lr",
    "reward/error_count",
    "reward/timeout_count",
)


def load_script(name: str) -> ModuleType:
    """Import ``scripts/<name>.py`` (scripts/ is not a package)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    sys.modules[name] = module  # dataclasses look their module up while the file executes
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def reference() -> ModuleType:
    return load_script("generate_config_reference")


# ------------------------------------------------------------------------------------------------ config reference
def test_config_reference_is_current():
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "generate_config_reference.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_yaml_leaf_key_is_in_the_reference(reference):
    text = (DOCS / "config_reference.md").read_text(encoding="utf-8")
    keys = [key for key, _ in reference.yaml_leaves()]
    assert len(keys) > 300
    missing = [key for key in keys if f"| `{key}` |" not in text]
    assert not missing, f"keys missing from docs/config_reference.md: {missing}"


def test_a_key_without_description_fails_the_generator(reference, monkeypatch):
    monkeypatch.delitem(reference.DESCRIPTIONS, "trainer.total_epochs")
    with pytest.raises(SystemExit, match=r"trainer\.total_epochs: no description"):
        reference.render()


def test_unread_keys_are_still_unused(reference):
    """A key of the unread table (verl/trainer/config/unread.py) whose name starts to appear in the code must leave
    the table; an entry exempt from this check (its name is used for other things, or another engine reads it) must
    still have a name that appears, so the exemption cannot go stale either."""
    unread = reference.unread
    code = reference.code_outside_config()
    exempt = {e.key for e in unread.UNREAD if e.engine is not None} | set(unread.NAME_USED_ELSEWHERE)
    used = [e.key for e in unread.UNREAD if e.key not in exempt and reference.referenced(e.key.split(".")[-1], code)]
    assert not used, (
        f"these keys are in the unread table (warned or refused when set) but their names now appear in verl/: "
        f"{used}; check whether they are read, update verl/trainer/config/unread.py and regenerate the reference"
    )
    stale = sorted(key for key in exempt if not reference.referenced(key.split(".")[-1], code))
    assert not stale, f"exempt from the name check, but their names no longer appear in verl/: {stale}"
    assert set(unread.NAME_USED_ELSEWHERE) <= {e.key for e in unread.UNREAD}


def test_docstring_args_parser():
    reference = load_script("generate_config_reference")
    doc = """Summary.

    Args:
        alpha: first line
            continued.
        beta / gamma: shared.
        nested.key: a key inside a mapping.

    Returns:
        not an argument.
    """
    assert reference.parse_args_section(doc) == {
        "alpha": "first line continued.",
        "beta": "shared.",
        "gamma": "shared.",
        "nested.key": "a key inside a mapping.",
    }


# ------------------------------------------------------------------------------------------------ build
def test_docs_build(tmp_path):
    pytest.importorskip("markdown")
    build_docs = load_script("build_docs")
    problems = build_docs.build(tmp_path)
    assert problems == []
    assert (tmp_path / "README.html").exists()
    for page in DOCS.glob("*.md"):
        assert (tmp_path / "docs" / f"{page.stem}.html").exists()
    index = (tmp_path / "docs" / "index.html").read_text(encoding="utf-8")
    assert 'href="quickstart.html"' in index  # links between pages point at the HTML


def test_build_docs_reports_each_kind_of_problem(tmp_path):
    pytest.importorskip("markdown")
    build_docs = load_script("build_docs")
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(
        "# Readme\n\n[ok](docs/a.md#title) [gone](docs/missing.md) [bad anchor](docs/a.md#nope)\n", encoding="utf-8"
    )
    (tmp_path / "docs" / "a.md").write_text("# Title\n\n[self](#title) [up](../README.md#readme)\n", encoding="utf-8")
    (tmp_path / "docs" / "orphan.md").write_text("# Orphan\n", encoding="utf-8")
    problems = build_docs.build(tmp_path / "out", root=tmp_path, check_reference=False)
    text = "\n".join(problems)
    assert len(problems) == 3, text
    assert "README.md: link 'docs/missing.md'" in text
    assert "README.md: link 'docs/a.md#nope': no heading with anchor #nope in docs/a.md" in text
    assert "docs/orphan.md: orphan" in text


def test_anchor_slugs_follow_github():
    build_docs = load_script("build_docs")
    assert build_docs.slugify("The house: which package holds what") == "the-house-which-package-holds-what"
    assert build_docs.slugify("actor_rollout_ref.model") == "actor_rollout_refmodel"
    assert build_docs.slugify("Recipe: REINFORCE++") == "recipe-reinforce"


# ------------------------------------------------------------------------------------------------ algorithms
def test_every_registered_algorithm_is_documented():
    from verl.trainer.config.algorithm import KL_PENALTY_TYPES, LOSS_AGG_MODES
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, POLICY_LOSS_REGISTRY, AdvantageEstimator

    text = (DOCS / "algorithms.md").read_text(encoding="utf-8")
    names = {
        "advantage estimator": set(ADV_ESTIMATOR_REGISTRY) | {e.value for e in AdvantageEstimator},
        "policy loss": set(POLICY_LOSS_REGISTRY),
        "KL estimator": set(KL_PENALTY_TYPES),
        "loss_agg_mode": set(LOSS_AGG_MODES),
    }
    missing = {kind: sorted(n for n in found if f"`{n}`" not in text) for kind, found in names.items()}
    assert not any(missing.values()), f"not documented in docs/algorithms.md: {missing}"


# ------------------------------------------------------------------------------------------------ metrics
def documented_metric_patterns() -> list[re.Pattern]:
    """The names in the first column of docs/metrics.md's tables, ``<x>`` standing for any text."""
    patterns = []
    for line in (DOCS / "metrics.md").read_text(encoding="utf-8").splitlines():
        if not line.startswith("|"):
            continue
        first_cell = line.split(" | ")[0]
        for name in re.findall(r"`([^`]+)`", first_cell):
            if "/" in name:
                regex = re.sub(r"<[^>]+>", ".+", re.escape(name).replace(r"\<", "<").replace(r"\>", ">"))
                patterns.append(re.compile(regex))
    return patterns


def literal_metric_names() -> set[str]:
    """The string literals of ``METRIC_MODULES`` used as a dict key or a subscript (``{"actor/x": ...}``,
    ``metrics["actor/x"]``) that are whole metric names."""
    names = set()
    for path in METRIC_MODULES:
        tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
        keys = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Dict):
                keys += node.keys
            elif isinstance(node, ast.Subscript):
                keys.append(node.slice)
        for key in keys:
            if isinstance(key, ast.Constant) and isinstance(key.value, str) and METRIC_NAME.match(key.value):
                names.add(key.value)
    return names


def timed_stages() -> list[str]:
    """The stage names of ``marked_timer("<stage>", ...)`` / ``self._stage("<stage>", ...)`` calls in the trainer."""
    tree = ast.parse((ROOT / "verl/trainer/ppo/ray_trainer.py").read_text(encoding="utf-8"))
    return sorted(
        {
            node.args[0].value
            for node in ast.walk(tree)
            if isinstance(node, ast.Call)
            and (getattr(node.func, "id", None) == "marked_timer" or getattr(node.func, "attr", None) == "_stage")
            and node.args
            and isinstance(node.args[0], ast.Constant)
        }
    )


def computed_metric_names() -> set[str]:
    """Names produced by calling the metric functions on a tiny batch."""
    from verl.checkpoint_engine import ColocatedCheckpointEngine
    from verl.protocol import DataProto
    from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY, FixedKLController
    from verl.trainer.ppo.metric_utils import (
        compute_data_metrics,
        compute_partial_rollout_metrics,
        compute_staleness_metrics,
        compute_throughout_metrics,
        compute_timing_metrics,
    )
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_rejection_mask
    from verl.trainer.ppo.utils import apply_kl_penalty
    from verl.utils.seqlen_balancing import log_seqlen_unbalance
    from verl.workers.fsdp_workers import rollout_mismatch_metrics

    gen = torch.Generator().manual_seed(0)
    bs, prompt_len, resp_len = 4, 3, 5
    response_mask = torch.ones(bs, resp_len)
    response_mask[0, 3:] = 0

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen)

    log_prob, old_log_prob = -rand(bs, resp_len).abs(), -rand(bs, resp_len).abs()
    batch = DataProto.from_dict(
        {
            "responses": torch.zeros(bs, resp_len, dtype=torch.long),
            "response_mask": response_mask,
            "attention_mask": torch.cat([torch.ones(bs, prompt_len), response_mask], dim=-1),
            "token_level_scores": rand(bs, resp_len),
            "token_level_rewards": rand(bs, resp_len),
            "advantages": rand(bs, resp_len),
            "returns": rand(bs, resp_len),
            "values": rand(bs, resp_len),
            "old_log_probs": old_log_prob,
            "ref_log_prob": log_prob,
        }
    )
    names: set[str] = set()
    timing = {stage: 0.5 for stage in timed_stages()}
    names |= set(compute_data_metrics(batch, use_critic=True))
    ranges = np.empty(bs, dtype=object)
    ranges[:] = [[[0, resp_len, 2]]] * bs
    batch.non_tensor_batch["weight_version_ranges"] = ranges
    names |= set(compute_staleness_metrics(batch, 3))
    names |= set(compute_partial_rollout_metrics(batch))
    names |= set(compute_timing_metrics(batch, timing))
    names |= set(compute_throughout_metrics(batch, timing, 2))
    names |= set(log_seqlen_unbalance([3, 5, 7, 9], [[0, 3], [1, 2]]))
    names |= set(apply_kl_penalty(batch, FixedKLController(0.1), "low_var_kl")[1])
    names |= set(rollout_mismatch_metrics(log_prob, old_log_prob, response_mask))
    names |= set(
        compute_rollout_correction_and_rejection_mask(
            log_prob,
            old_log_prob,
            response_mask,
            rollout_is="token",
            rollout_is_threshold="0.5_2.0",
            rollout_is_batch_normalize=True,
            rollout_rs="token_k1,seq_mean_k3",
            rollout_rs_threshold="0.5_2.0,5.0",
        )[2]
    )
    rollout_correction = {"rollout_is": "sequence", "rollout_is_threshold": 2.0, "loss_type": "reinforce"}
    config = {"clip_ratio": 0.2, "policy_loss": {"rollout_correction": rollout_correction, "dro_beta": 0.1}}
    for fn in POLICY_LOSS_REGISTRY.values():
        _, metrics = fn(old_log_prob, log_prob, rand(bs, resp_len), response_mask, "token-mean", config, None)
        names |= set(metrics)

    class Sink:
        def update_weights(self, named_tensors):
            list(named_tensors)

    stats = ColocatedCheckpointEngine(bucket_megabytes=1).send_weights([("w", torch.zeros(3))], Sink())
    names |= {f"weight_sync/{key}" for key in stats}  # ActorRolloutRefWorker.update_weights adds the prefix
    return names


def undocumented(names: set[str]) -> list[str]:
    patterns = documented_metric_patterns()
    return sorted(name for name in names if not any(p.fullmatch(name) for p in patterns))


def test_every_step_metric_is_documented():
    names = set(STATIC_METRICS) | literal_metric_names() | computed_metric_names()
    assert len(names) > 80
    missing = undocumented(names)
    assert not missing, f"metric names missing from docs/metrics.md: {missing}"


def test_every_timed_stage_is_named_in_the_metrics_doc():
    text = (DOCS / "metrics.md").read_text(encoding="utf-8")
    stages = timed_stages()
    assert "gen" in stages and "update_actor" in stages
    missing = [stage for stage in stages if f"`{stage}`" not in text]
    assert not missing, f"timing stages not listed in docs/metrics.md: {missing}"


def test_validation_metric_names_are_documented():
    from verl.trainer.ppo import validation

    n = 4
    sources = ["openai/gsm8k"] * (2 * n)
    uids = [f"p{i // n}" for i in range(2 * n)]
    rng = np.random.default_rng(0)
    infos = {
        "reward": rng.random(2 * n).tolist(),
        "acc": rng.integers(0, 2, 2 * n).astype(float).tolist(),
        "pred": [str(v) for v in rng.integers(0, 3, 2 * n)],
    }
    names = set(validation.validation_metrics(sources, uids, infos))
    assert any(name.startswith("val-core/openai/gsm8k/acc/") for name in names)
    assert any("/maj@" in name for name in names)
    assert not undocumented(names), undocumented(names)
