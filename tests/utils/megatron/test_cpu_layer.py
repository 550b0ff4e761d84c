"""megatron-core trains on CPU over gloo with ``verl.utils.megatron.cpu_layer``: a tiny Qwen2-like GPTModel (RMSNorm,
SwiGLU, GQA, qkv bias, RoPE) gives the same step-1 loss, grad norm and post-step loss under TP=2, PP=2 (1F1B),
DP=2 (distributed optimizer) and TP2xPP2 with sequence parallelism as the plain TP=1 model (fp32, within 1e-5).

Two launches: 2 ranks run TP=2, PP=2 and DP=2 one after the other (re-initialising model parallel); 4 ranks run
TP2xPP2+SP with tied embeddings. Every rank first builds the full TP=1 model from a fixed seed, computes the
reference step with plain torch (clip_grad_norm_ + AdamW) and shards the same weights for each layout."""

from __future__ import annotations

import json
import os
import tempfile
import time
from typing import Any

import pytest
import torch

pytest.importorskip("megatron.core")

import torch.multiprocessing as mp  # noqa: E402

from tests.dist_utils import _entry, file_init_method  # noqa: E402

SEQ, MICRO_BATCH, NUM_MICROBATCHES, VOCAB, NUM_LAYERS = 16, 2, 2, 256, 4
LR, CLIP = 1e-3, 1.0
TOL = 1e-5
LAUNCH_TIMEOUT_S = 240


# ---------------------------------------------------------------- worker side


def _config(tp: int = 1, pp: int = 1, sp: bool = False, tied: bool = False) -> Any:
    import torch.nn.functional as F
    from megatron.core.transformer import TransformerConfig

    from verl.utils.megatron.cpu_layer import cpu_transformer_config_overrides

    return TransformerConfig(
        num_layers=NUM_LAYERS,
        hidden_size=64,
        ffn_hidden_size=128,
        num_attention_heads=4,
        num_query_groups=2,
        kv_channels=16,
        normalization="RMSNorm",
        layernorm_epsilon=1e-6,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=True,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        params_dtype=torch.float32,
        pipeline_dtype=torch.float32,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        sequence_parallel=sp,
        **cpu_transformer_config_overrides(),
    )


def _build(config: Any, tied: bool) -> Any:
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    return GPTModel(
        config,
        get_gpt_layer_local_spec(normalization="RMSNorm"),
        vocab_size=VOCAB,
        max_sequence_length=64,
        pre_process=ps.is_pipeline_first_stage(),
        post_process=ps.is_pipeline_last_stage(),
        share_embeddings_and_output_weights=tied,
        position_embedding_type="rope",
    )


def _micro_batches() -> list[dict[str, torch.Tensor]]:
    """Right-padded micro-batches with an explicit causal + padding boolean mask (True = masked)."""
    gen = torch.Generator().manual_seed(7)
    batches = []
    for lengths in ([SEQ, 11], [13, SEQ]):
        tokens = torch.randint(0, VOCAB, (MICRO_BATCH, SEQ + 1), generator=gen)
        valid = torch.arange(SEQ + 1)[None, :] < torch.tensor(lengths)[:, None] + 1
        keys = valid[:, :SEQ]
        allowed = torch.tril(torch.ones(SEQ, SEQ, dtype=torch.bool))[None] & keys[:, None, :]
        batches.append(
            {
                "tokens": tokens[:, :SEQ].contiguous(),
                "labels": tokens[:, 1:].contiguous(),
                "loss_mask": valid[:, 1:].float(),
                "position_ids": torch.arange(SEQ).expand(MICRO_BATCH, SEQ).contiguous(),
                "attention_mask": ~allowed[:, None],
            }
        )
    return batches


def _masked_mean(per_token: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    return (per_token * loss_mask).sum() / loss_mask.sum()


def _reference(tied: bool) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """Full weights (TP=1, seeded) and the plain-torch step: mean of the micro-batch losses, its grad norm, and the
    loss after clip_grad_norm_ + AdamW."""
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel

    ps.initialize_model_parallel(1, 1)
    tensor_parallel.model_parallel_cuda_manual_seed(1234)
    model = _build(_config(tied=tied), tied)
    full = {k: v.detach().clone() for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)}

    def loss() -> torch.Tensor:
        losses = [
            _masked_mean(model(b["tokens"], b["position_ids"], b["attention_mask"], labels=b["labels"]), b["loss_mask"])
            for b in _micro_batches()
        ]
        return torch.stack(losses).mean()

    loss1 = loss()
    loss1.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    optimizer.step()
    with torch.no_grad():
        loss2 = loss()
    ps.destroy_model_parallel()
    return full, {"loss1": loss1.item(), "grad_norm": grad_norm.item(), "loss2": loss2.item()}


def _shard(full: dict[str, torch.Tensor], tp: int, pp: int, tied: bool) -> dict[str, torch.Tensor]:
    """This rank's piece of the full TP=1 state dict (megatron's TP/PP layout)."""
    from megatron.core import parallel_state as ps

    tp_rank, pp_rank = ps.get_tensor_model_parallel_rank(), ps.get_pipeline_model_parallel_rank()
    per_stage = NUM_LAYERS // pp
    first, last = pp_rank == 0, pp_rank == pp - 1
    shard = {}
    for key, value in full.items():
        if key.startswith("decoder.layers."):
            index, rest = key.split(".", 3)[2:]
            if int(index) // per_stage != pp_rank:
                continue
            key = f"decoder.layers.{int(index) - pp_rank * per_stage}.{rest}"
        elif (key.startswith("embedding.") and not first) or (
            key.startswith(("decoder.final_layernorm.", "output_layer.")) and not last
        ):
            continue
        if key.endswith(("linear_proj.weight", "linear_fc2.weight")):  # row parallel
            value = value.chunk(tp, dim=1)[tp_rank]
        elif key.endswith("linear_fc1.weight"):  # SwiGLU: [gate; up], each column parallel
            value = torch.cat([half.chunk(tp, dim=0)[tp_rank] for half in value.chunk(2, dim=0)])
        elif key.endswith(("word_embeddings.weight", "output_layer.weight", "linear_qkv.weight", "linear_qkv.bias")):
            value = value.chunk(tp, dim=0)[tp_rank]  # vocab parallel / column parallel (qkv grouped per query group)
        shard[key] = value.clone()
    if tied and last and not first:  # the last stage's copy of the tied embedding
        shard["output_layer.weight"] = full["embedding.word_embeddings.weight"].chunk(tp, dim=0)[tp_rank].clone()
    return shard


def _rng_streams() -> dict:
    """Draws from the RNG tracker's tensor-parallel and data-parallel streams, compared across the TP group."""
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel

    tracker = tensor_parallel.get_cuda_rng_tracker()
    outer = torch.get_rng_state()
    with tracker.fork():
        tp_draw = torch.rand(4)
    with tracker.fork(tensor_parallel.random.get_data_parallel_rng_tracker_name()):
        dp_draw = torch.rand(4)
    restored = torch.equal(outer, torch.get_rng_state())
    gathered = []
    for draw in (tp_draw, dp_draw):
        parts = [torch.empty_like(draw) for _ in range(ps.get_tensor_model_parallel_world_size())]
        torch.distributed.all_gather(parts, draw, group=ps.get_tensor_model_parallel_group())
        gathered.append(parts)
    return {
        "tracker": type(tracker).__name__,
        "outer_state_restored": restored,
        "tp_streams_differ": not torch.equal(*gathered[0][:2]),
        "dp_stream_shared": all(torch.equal(gathered[1][0], part) for part in gathered[1]),
    }


def _run_layout(full: dict[str, torch.Tensor], tp: int, pp: int, sp: bool, tied: bool, dist_opt: bool) -> dict:
    """One optimizer step of the sharded model under megatron DDP + get_megatron_optimizer."""
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.pipeline_parallel import get_forward_backward_func

    ps.initialize_model_parallel(tp, pp)
    tensor_parallel.model_parallel_cuda_manual_seed(1234)
    rng = _rng_streams() if tp > 1 else None
    config = _config(tp, pp, sp, tied)
    model = _build(config, tied)
    missing, unexpected = model.load_state_dict(_shard(full, tp, pp, tied), strict=False)
    assert not unexpected and all(k.endswith("_extra_state") for k in missing), (missing, unexpected)
    ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=True, use_distributed_optimizer=dist_opt)
    model = DistributedDataParallel(config, ddp_config, model)
    optimizer = get_megatron_optimizer(
        OptimizerConfig(
            optimizer="adam", lr=LR, weight_decay=0.0, adam_eps=1e-8, clip_grad=CLIP, use_distributed_optimizer=dist_opt
        ),
        [model],
    )
    config.finalize_model_grads_func = finalize_model_grads

    # Data parallel ranks split the micro-batches; DDP averages their gradients.
    dp, dp_rank = ps.get_data_parallel_world_size(), ps.get_data_parallel_rank()
    batches = _micro_batches()[dp_rank::dp]

    def forward_step(data_iterator: Any, module: Any) -> tuple[torch.Tensor, Any]:
        b = next(data_iterator)
        output = module(b["tokens"], b["position_ids"], b["attention_mask"], labels=b["labels"])

        def loss_func(per_token: torch.Tensor) -> tuple[torch.Tensor, dict]:
            loss = _masked_mean(per_token, b["loss_mask"])
            return loss, {"loss": loss.detach().clone()}  # the schedule divides `loss` in place

        return output, loss_func

    def run(forward_only: bool) -> float | None:
        losses = get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iter(batches),
            model=[model],
            num_microbatches=len(batches),
            seq_length=SEQ,
            micro_batch_size=MICRO_BATCH,
            forward_only=forward_only,
        )
        if not ps.is_pipeline_last_stage():
            return None
        loss = torch.stack([d["loss"] for d in losses]).mean()
        torch.distributed.all_reduce(loss, group=ps.get_data_parallel_group())
        return (loss / dp).item()

    model.zero_grad_buffer()
    optimizer.zero_grad()
    loss1 = run(forward_only=False)
    update_successful, grad_norm, _ = optimizer.step()
    assert update_successful
    loss2 = run(forward_only=True)
    ps.destroy_model_parallel()
    inner = [type(o).__name__ for o in getattr(optimizer, "chained_optimizers", [optimizer])]
    return {"loss1": loss1, "grad_norm": grad_norm, "loss2": loss2, "optimizers": inner, "rng": rng}


def _worker(rank: int, layouts: list[dict], tied: bool, out_dir: str) -> None:
    from verl.utils.megatron.cpu_layer import apply_cpu_layer

    apply_cpu_layer()
    apply_cpu_layer()  # idempotent
    full, reference = _reference(tied)
    results = {"reference": reference}
    for layout in layouts:
        results[layout["name"]] = _run_layout(full, layout["tp"], layout["pp"], layout["sp"], tied, layout["dist_opt"])
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)


# ---------------------------------------------------------------- test side


def _launch(world: int, layouts: list[dict], tied: bool) -> list[dict]:
    """Run ``_worker`` on ``world`` gloo ranks; kill them all after LAUNCH_TIMEOUT_S. Returns each rank's results."""
    with tempfile.TemporaryDirectory(prefix="verl-mcore-cpu-") as folder:
        context = mp.start_processes(
            _entry,
            args=(world, file_init_method(folder), _worker, (layouts, tied, folder)),
            nprocs=world,
            join=False,
            start_method="spawn",
        )
        deadline = time.monotonic() + LAUNCH_TIMEOUT_S
        try:
            while not context.join(timeout=5):  # raises ProcessRaisedException / ProcessExitedException on failure
                if time.monotonic() > deadline:
                    raise TimeoutError(f"megatron CPU workers did not finish in {LAUNCH_TIMEOUT_S} s")
        finally:
            for process in context.processes:
                if process.is_alive():
                    process.kill()
                    process.join(10)
        results = []
        for rank in range(world):
            with open(os.path.join(folder, f"rank{rank}.json")) as f:
                results.append(json.load(f))
        return results


def _layout(name: str, tp: int, pp: int, sp: bool = False, dist_opt: bool = False) -> dict:
    return {"name": name, "tp": tp, "pp": pp, "sp": sp, "dist_opt": dist_opt}


@pytest.fixture(scope="module")
def two_ranks() -> list[dict]:
    layouts = [_layout("tp2", 2, 1), _layout("pp2", 1, 2), _layout("dp2_dist_opt", 1, 1, dist_opt=True)]
    return _launch(2, layouts, tied=False)


@pytest.fixture(scope="module")
def four_ranks() -> list[dict]:
    return _launch(4, [_layout("tp2_pp2_sp", 2, 2, sp=True)], tied=True)


def _assert_matches(results: list[dict], name: str) -> None:
    for rank, result in enumerate(results):
        reference, got = result["reference"], result[name]
        assert got["grad_norm"] == pytest.approx(reference["grad_norm"], abs=TOL), (rank, name, got, reference)
        if got["loss1"] is not None:  # the last pipeline stage reports the losses
            assert got["loss1"] == pytest.approx(reference["loss1"], abs=TOL), (rank, name, got, reference)
            assert got["loss2"] == pytest.approx(reference["loss2"], abs=TOL), (rank, name, got, reference)
    assert sum(r[name]["loss1"] is not None for r in results) > 0
    # The step changed the weights enough to see: the post-step loss differs from the step-1 loss.
    assert abs(results[0]["reference"]["loss2"] - results[0]["reference"]["loss1"]) > 100 * TOL


# Each test requests the `gloo` fixture only for its tier (integration: it starts a gloo process group); the launch
# itself goes through `_launch`, which bounds it with a timeout.
@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", ["tp2", "pp2", "dp2_dist_opt"])
def test_two_rank_layouts_match_tp1(gloo, two_ranks, name):
    _assert_matches(two_ranks, name)


@pytest.mark.timeout(300)
def test_distributed_optimizer_used(gloo, two_ranks):
    assert two_ranks[0]["dp2_dist_opt"]["optimizers"] == ["DistributedOptimizer"]
    assert two_ranks[0]["tp2"]["optimizers"] == ["FP32Optimizer"]


@pytest.mark.timeout(300)
def test_rng_tracker_streams_on_cpu(gloo, two_ranks):
    """The CPU tracker gives each TP rank its own model-parallel stream, one shared data-parallel stream, and
    restores the default stream after a fork."""
    for result in two_ranks:
        assert result["tp2"]["rng"] == {
            "tracker": "CpuRNGStatesTracker",
            "outer_state_restored": True,
            "tp_streams_differ": True,
            "dp_stream_shared": True,
        }


@pytest.mark.timeout(300)
def test_tp2_pp2_sequence_parallel_tied_matches_tp1(gloo, four_ranks):
    _assert_matches(four_ranks, "tp2_pp2_sp")


def test_cpu_layer_api():
    from verl.utils.megatron import cpu_layer

    cpu_layer.check_megatron_core_version()
    overrides = cpu_layer.cpu_transformer_config_overrides()
    assert overrides["use_cpu_initialization"] is True
    assert not any(v for k, v in overrides.items() if k != "use_cpu_initialization")


def test_version_mismatch_is_a_clear_error(monkeypatch):
    from megatron.core import package_info

    from verl.utils.megatron import cpu_layer

    monkeypatch.setattr(package_info, "__version__", "0.0.1")
    with pytest.raises(RuntimeError, match=r"megatron-core 0\.0\.1 is installed.*tested with megatron-core 0\.16\.1"):
        cpu_layer.check_megatron_core_version()
