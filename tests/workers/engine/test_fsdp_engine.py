"""FSDPEngine on real 2-rank gloo process groups (tiny Qwen2, float32) against single-process PyTorch references.

One spawned 2-rank run (the ``dist_run`` fixture) builds several engines and records what it saw into files; the tests
compare those records with references computed here, in one process, with plain PyTorch. Process start-up dominates
the runtime, so the distributed checks share that one run (plus a 1-rank run that reloads its checkpoint).
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
import random
import shutil

import numpy as np
import pytest
import torch

from verl.utils.tiny_model import save_tiny_qwen2
from verl.workers.config.engine import FSDPEngineConfig
from verl.workers.config.optimizer import FSDPOptimizerConfig
from verl.workers.engine import FSDPEngine, get_engine_class, register_engine
from verl.workers.engine.checkpoint import check_checkpoint_files
from verl.workers.engine.full_state import _rows_per_rank, hf_name
from verl.workers.engine.hf_model import decoder_layer_classes, load_hf_model
from verl.workers.engine.optim import build_optimizer
from verl.workers.engine.sharding import mixed_precision_policy

WORLD = 2
LR = 1e-3
TOTAL_STEPS = 10
MIN_LR_RATIO = 0.1
# One AdamW step moves each weight by about lr; float32 reordering of the gradient sums changes it by ~1e-9.
STEP_TOL = 1e-6


# ----------------------------------------------------------------------------- shared helpers
def _batch() -> torch.Tensor:
    """The global batch (4 sequences × 12 tokens); rank r trains on its r-th half."""
    return torch.randint(3, 256, (4, 12), generator=torch.Generator().manual_seed(123))


def _lm_loss(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross entropy of ``ids`` (B, T)."""
    logits = model(input_ids=ids).logits.float()
    return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def _engine_config(**overrides) -> FSDPEngineConfig:
    return FSDPEngineConfig(**{"dtype": "float32", **overrides})


def _optim_config(**overrides) -> FSDPOptimizerConfig:
    fields = {"lr": LR, "lr_scheduler_type": "cosine", "total_training_steps": TOTAL_STEPS}
    return FSDPOptimizerConfig(**{**fields, "min_lr_ratio": MIN_LR_RATIO, **overrides})


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert list(a) == list(b)
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _expect_error(fn, exc_type: type[BaseException]) -> str:
    try:
        fn()
    except exc_type as e:
        return str(e)
    raise AssertionError(f"{fn} did not raise {exc_type.__name__}")


def _train_step(engine: FSDPEngine, ids: torch.Tensor) -> tuple[float, float]:
    _lm_loss(engine.module, ids).backward()
    return engine.clip_grad_norm_and_step(), engine.lr_scheduler_step()


# ----------------------------------------------------------------------------- the 2-rank run
def _two_rank_checks(rank: int, model_dir: str, tied_dir: str, out: str) -> None:
    records = _Records()
    logging.getLogger("verl.workers.engine").addHandler(records)
    logging.getLogger("verl.workers.engine").setLevel(logging.INFO)
    ids = _batch().chunk(WORLD)[rank]
    r: dict = {}

    # Actor: gather, no-grad forward, one step, a NaN step, checkpoint round trip.
    engine = FSDPEngine(model_dir, _engine_config(), _optim_config())
    r["init_sd"] = engine.get_full_state_dict()
    bucketed = dict(engine.iter_full_state_dict(bucket_bytes=50_000))
    r["bucketed_equal"] = _max_diff(bucketed, r["init_sd"]) == 0.0
    bf16 = dict(engine.iter_full_state_dict(dtype=torch.bfloat16))
    bf16_bucketed = dict(engine.iter_full_state_dict(dtype=torch.bfloat16, bucket_bytes=50_000))
    r["bf16_bucketed_equal"] = _max_diff(bf16, bf16_bucketed) == 0.0 and bf16["lm_head.weight"].dtype == torch.bfloat16
    with engine.eval_mode():
        r["eval_logits"] = engine.module(input_ids=ids).logits
    r["lr_0"] = engine.get_lr()
    r["grad_norm"], r["lr_1"] = _train_step(engine, ids)
    r["step1_sd"] = engine.get_full_state_dict()

    _lm_loss(engine.module, ids).backward()
    if rank == 0:
        next(p for p in engine.module.parameters() if p.grad is not None).grad.to_local().view(-1)[0] = float("nan")
    r["nan_norm"] = engine.clip_grad_norm_and_step()
    r["nan_step_kept_weights"] = _max_diff(engine.get_full_state_dict(), r["step1_sd"]) == 0.0
    r["nan_grads_cleared"] = all(p.grad is None for p in engine.module.parameters())

    ckpt = os.path.join(out, "ckpt")
    torch.manual_seed(100 + rank)  # each rank its own random stream, saved with the checkpoint
    engine.save_checkpoint(ckpt)
    r["draws_after_save"] = (torch.rand(3), random.random(), float(np.random.rand()))
    r["step2_norm"], r["lr_2"] = _train_step(engine, ids)
    r["step2_sd"] = engine.get_full_state_dict()
    engine.load_checkpoint(ckpt)
    r["draws_after_load"] = (torch.rand(3), random.random(), float(np.random.rand()))
    r["reloaded_sd"] = engine.get_full_state_dict()
    r["reloaded_lr"] = engine.get_lr()
    r["replay_norm"], r["replay_lr"] = _train_step(engine, ids)
    r["replay_sd"] = engine.get_full_state_dict()
    r["missing_ckpt_error"] = _expect_error(lambda: engine.load_checkpoint(os.path.join(out, "nowhere")), OSError)

    # Gradient checkpointing (+ forward prefetch, no reshard after forward): same grads as the reference.
    gc = FSDPEngine(
        model_dir,
        _engine_config(forward_prefetch=True, reshard_after_forward=False),
        _optim_config(),
        enable_gradient_checkpointing=True,
    )
    calls = []
    gc.module.model.layers[0].mlp.register_forward_pre_hook(lambda *a: calls.append(1))
    _lm_loss(gc.module, ids).backward()
    r["gc_layer_calls"] = len(calls)
    r["gc_grads"] = {n: p.grad.full_tensor() for n, p in gc.module.named_parameters()}
    del gc

    # Hybrid sharding (2 replicas of 1 shard): the same step as the 1-D mesh.
    hsdp = FSDPEngine(model_dir, _engine_config(fsdp_size=1), _optim_config())
    r["hsdp_mesh"] = tuple(hsdp.device_mesh.shape)
    _train_step(hsdp, ids)
    r["hsdp_step1_sd"] = hsdp.get_full_state_dict()
    r["hsdp_bucketed_equal"] = _max_diff(dict(hsdp.iter_full_state_dict(bucket_bytes=1024)), r["hsdp_step1_sd"]) == 0
    del hsdp

    # Value model from the causal-LM folder: a fresh head seeded by fsdp_config.seed.
    critic = FSDPEngine(model_dir, _engine_config(), _optim_config(), role="critic")
    with critic.eval_mode():
        r["value_logits_shape"] = tuple(critic.module(input_ids=ids).logits.shape)
    values = critic.module(input_ids=ids).logits.squeeze(-1)
    r["values_shape"] = tuple(values.shape)
    values.pow(2).mean().backward()
    r["critic_norm"] = critic.clip_grad_norm_and_step()
    critic_sd = critic.get_full_state_dict()
    r["critic_keys"] = list(critic_sd)
    critic.save_checkpoint(os.path.join(out, "critic_ckpt"))
    del critic

    # bf16 mixed precision over float32 weights (on a CPU without native bf16, faked here, start-up says it is slow).
    from verl.utils import device as device_utils

    device_utils.cpu_has_native_bf16 = lambda: False
    device_records = _Records()
    logging.getLogger("verl.utils.device").addHandler(device_records)
    mixed = FSDPEngine(model_dir, _engine_config(dtype="bfloat16"), _optim_config())
    r["bf16_emulated_warnings"] = [m for m in device_records.messages if "fsdp_config.dtype" in m]
    with mixed.eval_mode():
        r["bf16_logits_dtype"] = mixed.module(input_ids=ids).logits.dtype
        r["bf16_loss"] = _lm_loss(mixed.module, ids).item()
    mixed.zero_grad()
    r["bf16_norm"], _ = _train_step(mixed, ids)
    r["bf16_param_dtypes"] = {p.dtype for p in mixed.module.parameters()}
    del mixed

    # Reference policy (forward-only by its role) with offload flags (no-ops on CPU, logged once).
    ref = FSDPEngine(model_dir, _engine_config(param_offload=True, optimizer_offload=True), role="ref")
    r["ref_frozen"] = not any(p.requires_grad for p in ref.module.parameters())
    ref.load_params()
    ref.load_optimizer()
    ref.offload_params()
    r["ref_optimizer"] = ref.optimizer
    r["ref_step_error"] = _expect_error(ref.clip_grad_norm_and_step, RuntimeError)
    r["ref_sched_error"] = _expect_error(ref.lr_scheduler_step, RuntimeError)
    ref_ckpt = os.path.join(out, "ref_ckpt")
    ref.save_checkpoint(ref_ckpt)
    ref.load_checkpoint(ref_ckpt)
    r["no_optimizer_error"] = _expect_error(lambda: engine.load_checkpoint(ref_ckpt), ValueError)
    r["wrong_model_error"] = _expect_error(lambda: engine.load_checkpoint(os.path.join(out, "critic_ckpt")), ValueError)

    # Checkpoints damaged after the fact: rank 0 edits a copy, then every rank tries to load it.
    broken = {name: os.path.join(out, f"broken_{name}") for name in ("extra", "sched")}
    if rank == 0:
        for path in broken.values():
            shutil.copytree(ckpt, path)
        with open(os.path.join(broken["extra"], "extra_state.pt"), "wb") as f:
            f.write(b"not a pickle")
        torch.save({"world_size": WORLD}, os.path.join(broken["sched"], "extra_state.pt"))
    torch.distributed.barrier()
    r["corrupt_extra_error"] = _expect_error(lambda: engine.load_checkpoint(broken["extra"]), ValueError)
    r["no_sched_error"] = _expect_error(lambda: engine.load_checkpoint(broken["sched"]), ValueError)
    r["bad_fsdp_size_error"] = _expect_error(
        lambda: FSDPEngine(model_dir, _engine_config(fsdp_size=3), _optim_config()), ValueError
    )
    r["bad_path_error"] = _expect_error(
        lambda: FSDPEngine(os.path.join(out, "nomodel"), _engine_config(), _optim_config()), OSError
    )

    # Tied input/output embeddings (one parameter under two names, as in Qwen2.5-0.5B).
    tied = FSDPEngine(tied_dir, _engine_config(), _optim_config())
    r["tied_init_sd"] = tied.get_full_state_dict()
    r["tied_norm"], _ = _train_step(tied, ids)
    r["tied_step1_sd"] = tied.get_full_state_dict()  # recorded before the save: the round trip's reference
    tied.save_checkpoint(os.path.join(out, "tied_ckpt"))
    _train_step(tied, ids)  # move off the saved weights: only a real load brings them back
    r["tied_step2_sd"] = tied.get_full_state_dict()
    tied.load_checkpoint(os.path.join(out, "tied_ckpt"))
    r["tied_reloaded_sd"] = tied.get_full_state_dict()
    r["tied_still_tied"] = tied.module.lm_head.weight is tied.module.model.embed_tokens.weight
    del tied

    r["offload_logs"] = [m for m in records.messages if "offload calls do nothing" in m]
    r["nan_warnings"] = [m for m in records.messages if "skipping this optimizer step" in m]
    torch.save(r, os.path.join(out, f"rank{rank}.pt"))


def _reload_one_rank(rank: int, model_dir: str, out: str) -> None:
    engine = FSDPEngine(model_dir, _engine_config(), _optim_config())
    engine.load_checkpoint(os.path.join(out, "ckpt"))
    torch.save({"sd": engine.get_full_state_dict(), "lr": engine.get_lr()}, os.path.join(out, "one_rank.pt"))


def _plain_and_fsdp2_one_rank(rank: int, model_dir: str, out: str) -> None:
    """One rank: the plain module (the default) and FSDP2 (plain_single_rank=false) take two steps each; the plain
    engine's checkpoint is loaded by a fresh FSDP2 engine; a bf16 plain engine takes a step under autocast."""
    from torch.distributed.tensor import DTensor

    results = {}
    for name, plain in (("plain", True), ("fsdp2", False)):
        engine = FSDPEngine(model_dir, _engine_config(plain_single_rank=plain), _optim_config())
        steps = [_train_step(engine, half) for half in _batch().chunk(WORLD)]
        results[name] = {
            "sharded": any(isinstance(p, DTensor) for p in engine.module.parameters()),
            "steps": steps,
            "sd": engine.get_full_state_dict(),
        }
        if plain:
            engine.save_checkpoint(os.path.join(out, "plain_ckpt"))
    reloaded = FSDPEngine(model_dir, _engine_config(plain_single_rank=False), _optim_config())
    reloaded.load_checkpoint(os.path.join(out, "plain_ckpt"))
    results["reloaded_sd"] = reloaded.get_full_state_dict()
    results["reloaded_step"] = _train_step(reloaded, _batch())
    plain_again = FSDPEngine(model_dir, _engine_config(), _optim_config())
    plain_again.load_checkpoint(os.path.join(out, "plain_ckpt"))
    results["plain_again_step"] = _train_step(plain_again, _batch())
    bf16 = FSDPEngine(model_dir, _engine_config(dtype="bfloat16"), _optim_config())
    with torch.no_grad():
        results["bf16_logits_dtype"] = bf16.module(input_ids=_batch()).logits.dtype
    results["bf16_step"] = _train_step(bf16, _batch())
    results["bf16_param_dtypes"] = {p.dtype for p in bf16.module.parameters()}
    torch.save(results, os.path.join(out, "plain_vs_fsdp2.pt"))


@pytest.fixture(scope="module")
def dist_run(gloo, tiny_model_dir, tmp_path_factory) -> tuple[str, list[dict]]:
    out = str(tmp_path_factory.mktemp("fsdp_engine"))
    tied_dir = save_tiny_qwen2(os.path.join(out, "tied_qwen2"), seed=1, tie_word_embeddings=True)
    gloo(_two_rank_checks, WORLD, tiny_model_dir, tied_dir, out)
    return out, [torch.load(os.path.join(out, f"rank{r}.pt"), weights_only=False) for r in range(WORLD)]


@pytest.fixture(scope="module")
def reference(tiny_model_dir) -> dict:
    """One plain-PyTorch step on the whole batch: loss = mean of the ranks' mean losses (what FSDP's averaged
    gradients minimize), clip to 1.0, AdamW; also the same step with a 10 % larger lr (a wrong answer)."""
    out = {}
    for name, lr in (("ok", LR), ("wrong_lr", LR * 1.1)):
        model = load_hf_model(tiny_model_dir, value_model=False, dtype=torch.float32, seed=42)
        model.train()
        out["init_sd"] = {k: v.clone() for k, v in model.state_dict().items()}
        with torch.no_grad():
            out["logits"] = model(input_ids=_batch()).logits
            out["half_losses"] = [_lm_loss(model, half).item() for half in _batch().chunk(WORLD)]
        loss = sum(_lm_loss(model, half) for half in _batch().chunk(WORLD)) / WORLD
        loss.backward()
        out["grads"] = {n: p.grad.clone() for n, p in model.named_parameters()}
        out["grad_norm"] = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0).item()
        torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.999)).step()
        out[f"step1_sd_{name}"] = {k: v.clone() for k, v in model.state_dict().items()}
    return out


# ----------------------------------------------------------------------------- distributed checks
def test_full_state_dict_matches_hf_names_and_values(dist_run, reference):
    _, ranks = dist_run
    for r in ranks:
        assert list(r["init_sd"]) == list(reference["init_sd"])
        assert _max_diff(r["init_sd"], reference["init_sd"]) == 0.0
        assert r["bucketed_equal"] and r["bf16_bucketed_equal"]


def test_one_step_equals_single_process_reference(dist_run, reference):
    _, ranks = dist_run
    for r in ranks:
        assert r["lr_0"] == pytest.approx(LR, rel=1e-12)
        assert _max_diff(r["step1_sd"], reference["step1_sd_ok"]) < STEP_TOL
        # The tolerance would catch a step with a 10 % wrong learning rate.
        assert _max_diff(r["step1_sd"], reference["step1_sd_wrong_lr"]) > 10 * STEP_TOL
        assert _max_diff(r["hsdp_step1_sd"], reference["step1_sd_ok"]) < STEP_TOL and r["hsdp_mesh"] == (2, 1)
        assert r["hsdp_bucketed_equal"]


def test_grad_norm_metric_equals_reference(dist_run, reference):
    _, ranks = dist_run
    assert reference["grad_norm"] > 1.0  # so the step above also checks the clipping
    for r in ranks:
        assert r["grad_norm"] == pytest.approx(reference["grad_norm"], rel=1e-5)
        assert r["grad_norm"] != pytest.approx(reference["grad_norm"] * 1.001, rel=1e-5)


def test_no_grad_forward_matches_reference(dist_run, reference):
    _, ranks = dist_run
    full = torch.cat([r["eval_logits"] for r in ranks])
    assert (full - reference["logits"]).abs().max().item() < 1e-5


def test_lr_schedule_follows_cosine(dist_run):
    _, ranks = dist_run
    # Cosine without warmup over 10 steps: lr(k) = lr·(m + (1 − m)·½(1 + cos(π k / 10))), m = 0.1.
    expected = [LR * (MIN_LR_RATIO + (1 - MIN_LR_RATIO) * 0.5 * (1 + math.cos(math.pi * k / 10))) for k in (1, 2)]
    for r in ranks:
        assert r["lr_1"] == pytest.approx(expected[0], rel=1e-12)
        assert r["lr_2"] == pytest.approx(expected[1], rel=1e-12)


def test_nan_gradient_skips_the_step(dist_run):
    _, ranks = dist_run
    for r in ranks:
        assert math.isnan(r["nan_norm"])
        assert r["nan_step_kept_weights"] and r["nan_grads_cleared"]
        assert len(r["nan_warnings"]) == 1


def test_checkpoint_round_trip_is_exact(dist_run):
    _, ranks = dist_run
    for r in ranks:
        assert _max_diff(r["reloaded_sd"], r["step1_sd"]) == 0.0
        assert r["reloaded_lr"] == r["lr_1"]
        # every rank's python / numpy / torch random states come back with the checkpoint
        (t1, p1, n1), (t2, p2, n2) = r["draws_after_save"], r["draws_after_load"]
        assert torch.equal(t1, t2) and (p1, n1) == (p2, n2)
        # Replaying step 2 from the checkpoint needs the Adam moments and the schedule position, not just weights.
        assert _max_diff(r["replay_sd"], r["step2_sd"]) == 0.0
        assert (r["replay_norm"], r["replay_lr"]) == (r["step2_norm"], r["lr_2"])
        assert "checkpoint folder" in r["missing_ckpt_error"] and "nowhere" in r["missing_ckpt_error"]
    assert not torch.equal(ranks[0]["draws_after_save"][0], ranks[1]["draws_after_save"][0])


def test_checkpoint_errors_name_the_file(dist_run):
    _, ranks = dist_run
    for r in ranks:
        assert "has no optimizer state" in r["no_optimizer_error"]
        assert "is of another model: its num_labels=1" in r["wrong_model_error"]
        assert "extra_state.pt is corrupt" in r["corrupt_extra_error"]
        assert "has no lr-scheduler state" in r["no_sched_error"]
        assert "fsdp_size=3 must be -1 or divide the world size 2" in r["bad_fsdp_size_error"]
        assert "nomodel" in r["bad_path_error"] and "config.json" in r["bad_path_error"]


def test_checkpoint_file_checks(dist_run, tmp_path):
    out, _ = dist_run
    good = os.path.join(out, "ckpt")
    check_checkpoint_files(good)
    with pytest.raises(FileNotFoundError, match="checkpoint folder .*absent does not exist"):
        check_checkpoint_files(str(tmp_path / "absent"))
    for name, damage, error, message in (
        (".metadata", "delete", FileNotFoundError, r"\.metadata is missing"),
        ("extra_state.pt", "delete", FileNotFoundError, r"extra_state\.pt is missing"),
        ("__1_0.distcp", "delete", FileNotFoundError, r"__1_0\.distcp is missing \(\.metadata refers to it\)"),
        ("__0_0.distcp", "truncate", ValueError, r"__0_0\.distcp is truncated"),
        (".metadata", "truncate", ValueError, r"\.metadata is corrupt"),
    ):
        copy = str(tmp_path / f"{damage}{name}")
        shutil.copytree(good, copy)
        file = os.path.join(copy, name)
        if damage == "delete":
            os.remove(file)
        else:
            os.truncate(file, os.path.getsize(file) // 2)
        with pytest.raises(error, match=message):
            check_checkpoint_files(copy)


def test_checkpoint_loads_with_another_world_size(gloo, dist_run, tiny_model_dir):
    out, ranks = dist_run
    gloo(_reload_one_rank, 1, tiny_model_dir, out)
    one = torch.load(os.path.join(out, "one_rank.pt"), weights_only=False)
    assert _max_diff(one["sd"], ranks[0]["step1_sd"]) == 0.0 and one["lr"] == ranks[0]["lr_1"]


def test_one_rank_plain_module_equals_fsdp2(gloo, tiny_model_dir, tmp_path):
    """At world size 1 the engine skips FSDP2 (only copies there): the same steps bit for bit in float32, and its
    checkpoints load into FSDP2 engines (and back) exactly."""
    gloo(_plain_and_fsdp2_one_rank, 1, tiny_model_dir, str(tmp_path))
    r = torch.load(tmp_path / "plain_vs_fsdp2.pt", weights_only=False)
    assert not r["plain"]["sharded"] and r["fsdp2"]["sharded"]
    assert r["plain"]["steps"] == r["fsdp2"]["steps"]  # (grad norm, lr) of both steps, exactly
    assert _max_diff(r["plain"]["sd"], r["fsdp2"]["sd"]) == 0.0
    assert _max_diff(r["reloaded_sd"], r["plain"]["sd"]) == 0.0
    assert r["reloaded_step"] == r["plain_again_step"]  # the optimizer state and schedule came back too
    # mixed precision on one rank: bf16 matmuls under autocast, float32 weights (and AdamW state)
    assert r["bf16_logits_dtype"] == torch.bfloat16 and r["bf16_param_dtypes"] == {torch.float32}
    assert math.isfinite(r["bf16_step"][0])


def test_gradient_checkpointing_gives_the_same_grads(dist_run, reference):
    _, ranks = dist_run
    for r in ranks:
        assert r["gc_layer_calls"] == 2  # the layer's MLP ran again in backward
        assert _max_diff(r["gc_grads"], reference["grads"]) < 1e-6


def test_value_model(dist_run, tiny_model_dir):
    _, ranks = dist_run
    head = load_hf_model(tiny_model_dir, value_model=True, dtype=torch.float32, seed=42).score
    for r in ranks:
        assert r["value_logits_shape"] == (2, 12, 1) and r["values_shape"] == (2, 12)
        assert math.isfinite(r["critic_norm"])
        assert r["critic_keys"][-2:] == ["score.weight", "score.bias"] and "lm_head.weight" not in r["critic_keys"]
    assert torch.equal(
        head.weight, load_hf_model(tiny_model_dir, value_model=True, dtype=torch.float32, seed=42).score.weight
    )
    assert not torch.equal(
        head.weight, load_hf_model(tiny_model_dir, value_model=True, dtype=torch.float32, seed=7).score.weight
    )


def test_bf16_mixed_precision_runs(dist_run, reference):
    _, ranks = dist_run
    for rank, r in enumerate(ranks):
        # bf16 keeps ~3 significant digits: the loss is close to the float32 one, but not equal to it.
        assert r["bf16_loss"] == pytest.approx(reference["half_losses"][rank], rel=1e-2)
        assert r["bf16_loss"] != reference["half_losses"][rank]
        assert r["bf16_logits_dtype"] == torch.bfloat16 and r["bf16_param_dtypes"] == {torch.float32}
        assert math.isfinite(r["bf16_norm"]) and r["bf16_norm"] == pytest.approx(reference["grad_norm"], rel=0.05)
        assert len(r["bf16_emulated_warnings"]) == 1  # one start-up warning naming the key


def test_forward_only_engine(dist_run):
    _, ranks = dist_run
    for r in ranks:
        assert r["ref_optimizer"] is None and r["ref_frozen"]
        assert "forward-only" in r["ref_step_error"] and "forward-only" in r["ref_sched_error"]
        assert len(r["offload_logs"]) == 1 and "the device is the CPU" in r["offload_logs"][0]


# ----------------------------------------------------------------------------- single-process checks
def test_registry_maps_both_strategy_names():
    assert get_engine_class("fsdp") is FSDPEngine and get_engine_class("fsdp2") is FSDPEngine
    with pytest.raises(ValueError, match=r"unknown engine strategy 'deepspeed'; registered: \['fsdp', 'fsdp2'"):
        get_engine_class("deepspeed")
    if importlib.util.find_spec("megatron.core") is not None:  # registered when first asked for
        assert get_engine_class("megatron").__name__ == "MegatronEngine"
    with pytest.raises(ValueError, match="engine strategy 'fsdp' is already registered by FSDPEngine"):
        register_engine("fsdp")(type("Other", (), {}))
    assert register_engine("fsdp")(FSDPEngine) is FSDPEngine  # re-registering the same class is harmless


def test_constructor_errors(tiny_model_dir):
    with pytest.raises(ValueError, match=r"role='policy'; use one of \['actor', 'ref', 'critic', 'reward_model'\]"):
        FSDPEngine(tiny_model_dir, _engine_config(), _optim_config(), role="policy")
    with pytest.raises(ValueError, match="needs optim_config"):
        FSDPEngine(tiny_model_dir, {"dtype": "float32"})
    if torch.distributed.is_initialized():
        pytest.skip("a process group already exists in this process")
    with pytest.raises(RuntimeError, match="call verl.utils.distributed.initialize_global_process_group"):
        FSDPEngine(tiny_model_dir, _engine_config(), _optim_config())
    # A forward-only engine (by config, or by a role that never trains) needs no optimizer config.
    for config, role in (({"forward_only": True}, "actor"), ({}, "ref"), ({}, "reward_model")):
        with pytest.raises(RuntimeError, match="needs the default process group"):
            FSDPEngine(tiny_model_dir, config, role=role)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPUOffloadPolicy works on an accelerator")
def test_offload_policy_on_cpu_is_a_clear_error(tiny_model_dir):
    with pytest.raises(
        ValueError, match="CPUOffloadPolicy, which needs an accelerator.*use param_offload/optimizer_offload instead"
    ):
        FSDPEngine(tiny_model_dir, _engine_config(offload_policy=True), _optim_config())


def test_load_hf_model_missing_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no Hugging Face model at .*config\.json does not exist"):
        load_hf_model(str(tmp_path), value_model=False, dtype=torch.float32, seed=0)


def test_build_optimizer():
    params = list(torch.nn.Linear(3, 2).parameters())
    adamw = build_optimizer(params, _optim_config(weight_decay=0.1, override_optimizer_config={"eps": 1e-6}))
    assert isinstance(adamw, torch.optim.AdamW)
    group = adamw.param_groups[0]
    assert (group["lr"], group["weight_decay"], group["betas"], group["eps"]) == (LR, 0.1, (0.9, 0.999), 1e-6)
    sgd = build_optimizer(params, FSDPOptimizerConfig(optimizer="SGD", lr=0.5))
    assert isinstance(sgd, torch.optim.SGD) and "betas" not in sgd.param_groups[0]
    with pytest.raises(ValueError, match="optim.optimizer_impl='no_such_pkg.optim' cannot be imported"):
        build_optimizer(params, FSDPOptimizerConfig(optimizer_impl="no_such_pkg.optim"))
    with pytest.raises(ValueError, match="optim.optimizer='Adamw' is not an optimizer class in 'torch.optim'"):
        build_optimizer(params, FSDPOptimizerConfig(optimizer="Adamw"))


def test_mixed_precision_policy():
    assert mixed_precision_policy(FSDPEngineConfig(dtype="fp32")) is None
    policy = mixed_precision_policy(FSDPEngineConfig())  # veRL's default: fp32 weights, bf16 compute
    assert (policy.param_dtype, policy.reduce_dtype, policy.cast_forward_inputs) == (
        torch.bfloat16,
        torch.float32,
        True,
    )
    override = FSDPEngineConfig(mixed_precision={"param_dtype": "fp16", "reduce_dtype": "bf16", "buffer_dtype": "fp32"})
    policy = mixed_precision_policy(override)
    assert (policy.param_dtype, policy.reduce_dtype) == (torch.float16, torch.bfloat16)
    same = FSDPEngineConfig(model_dtype="bf16", dtype="bfloat16")
    assert mixed_precision_policy(same) is None


def test_decoder_layer_classes(tiny_model_dir):
    model = load_hf_model(tiny_model_dir, value_model=False, dtype=torch.float32, seed=0)
    assert decoder_layer_classes(model, {"min_num_params": 0}) == {"Qwen2DecoderLayer"}
    assert decoder_layer_classes(model, {"transformer_layer_cls_to_wrap": "Qwen2MLP"}) == {"Qwen2MLP"}
    assert decoder_layer_classes(model, {"disable": True}) == set()
    assert decoder_layer_classes(model, {"layer_class": ["Qwen2MLP"]}) == {"Qwen2MLP"}  # the other name
    config = FSDPEngineConfig(wrap_policy={"layer_class": "Qwen2MLP", "transformer_layer_cls_to_wrap": "Qwen2MLP"})
    assert decoder_layer_classes(model, config.wrap_policy) == {"Qwen2MLP"}


def test_full_state_helpers():
    assert hf_name("model._orig_mod.layers.0._checkpoint_wrapped_module.mlp.weight") == "model.layers.0.mlp.weight"
    # torch.chunk semantics: 5 rows over 2 ranks → 3 + 2; 1 row over 2 ranks → 1 + 0; 6 rows over 4 → 2, 2, 2, 0.
    assert _rows_per_rank(5, 2) == [3, 2] and _rows_per_rank(1, 2) == [1, 0] and _rows_per_rank(6, 4) == [2, 2, 2, 0]


def test_tied_embeddings(dist_run):
    out, ranks = dist_run
    hf = load_hf_model(os.path.join(out, "tied_qwen2"), value_model=False, dtype=torch.float32, seed=42)
    expected = {k: v.detach().clone() for k, v in hf.state_dict().items()}  # copies: hf takes a step below
    assert "lm_head.weight" in expected and hf.lm_head.weight is hf.model.embed_tokens.weight
    # The step of a plain single-process PyTorch model with the same tied parameter (as in the ``reference`` fixture).
    hf.train()
    (sum(_lm_loss(hf, half) for half in _batch().chunk(WORLD)) / WORLD).backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(hf.parameters(), 1.0).item()
    torch.optim.AdamW(hf.parameters(), lr=LR, weight_decay=0.01, betas=(0.9, 0.999)).step()
    step1 = {k: v.detach().clone() for k, v in hf.state_dict().items()}
    for r in ranks:
        assert list(r["tied_init_sd"]) == list(expected) and _max_diff(r["tied_init_sd"], expected) == 0.0
        assert r["tied_norm"] == pytest.approx(grad_norm, rel=1e-5)
        assert _max_diff(r["tied_step1_sd"], step1) < STEP_TOL
        # The round trip restores the weights saved after step 1, not those of the step-2 model it loads into ...
        assert _max_diff(r["tied_step2_sd"], r["tied_step1_sd"]) > 100 * STEP_TOL
        assert _max_diff(r["tied_reloaded_sd"], r["tied_step1_sd"]) == 0.0
        # ... and the loaded model still shares one tensor between its input and output embeddings.
        assert r["tied_still_tied"]
