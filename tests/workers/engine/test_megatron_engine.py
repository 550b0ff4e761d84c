"""The Megatron engine on CPU over gloo (4 ranks, one launch): every layout equals every other and the FSDP engine.

One spawn of 4 ranks runs, on the same tiny Qwen2 weights and the same 8-sequence batch (left-padded, ragged):
the FSDP engine (dp 4), then the Megatron engine at tp1 (dp 4), tp2 (dp 2), pp2 (dp 2, 1F1B over 2 micro-batches
of different shapes), tp2 × pp2 with sequence parallelism (dp 1), and tp1 in bf16. Each computes the batch's mean
next-token cross-entropy through its schedule, steps once, and reports the loss, the gradient norm and the updated
weights (gathered as HF tensors). Every fp32 layout agrees with the FSDP engine and with Megatron's tp1 within 1e-5
(bf16: within its precision). The bf16 run (with the distributed optimizer) and the tp2 × pp2 run also save a
checkpoint (with the HF weights), step twice, load the checkpoint and step twice again: the steps agree bit for bit;
the saved HF folder holds the trained weights. A critic engine (a value head on the backbone) at tp2 × pp2 gives the
values of transformers' token-classification model. Nothing is faked: this is megatron-core with
`verl.utils.megatron.cpu_layer`, the CPU stand-in for its CUDA spots.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.distributed as dist

pytest.importorskip("megatron.core")

from tests.dist_utils import spawn_gloo  # noqa: E402

# name: (tp, pp, sequence_parallel, dtype). "bf16" (dp 4) runs with the distributed optimizer, which shards its state
# (Adam's, and the fp32 main copies of the bf16 parameters) over the dp ranks; the others step SGD
LAYOUTS = {
    "tp1pp1": (1, 1, False, "float32"),
    "tp2pp1": (2, 1, False, "float32"),
    "tp1pp2": (1, 2, False, "float32"),
    "tp2pp2": (2, 2, True, "float32"),
    "bf16": (1, 1, False, "bfloat16"),
}
OPTIM = {"optimizer": "sgd", "lr": 0.1, "weight_decay": 0.0, "clip_grad": 1.0, "lr_warmup_steps": 0}


def _make_model(folder: str) -> None:
    """The tiny Qwen2 causal LM in ``folder``, and the same backbone as a value model (one label: a critic's, with
    its ``score`` head) in ``folder + "_value"``."""
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2ForTokenClassification

    config = Qwen2Config(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(folder)
    config.num_labels = 1
    Qwen2ForTokenClassification(config).save_pretrained(folder + "_value")


def _batch() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    bs, length = 8, 12
    ids = torch.randint(3, 256, (bs, length), generator=generator)
    lead = torch.tensor([0, 3, 1, 5, 2, 0, 4, 1])
    tail = torch.tensor([0, 0, 2, 1, 0, 3, 0, 2])
    arange = torch.arange(length)
    mask = ((arange[None] >= lead[:, None]) & (arange[None] < length - tail[:, None])).long()
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    return {"input_ids": ids * mask, "attention_mask": mask, "position_ids": position_ids}


def _token_loss(logits: torch.Tensor, micro: dict, total_tokens: float, dp_size: int) -> torch.Tensor:
    """Σ next-token cross-entropy over valid pairs / all tokens of the batch · dp_size (the agg_loss contract:
    gradient reduction averages over data-parallel ranks)."""
    valid = (micro["attention_mask"][:, 1:] * micro["attention_mask"][:, :-1]).bool()
    log_probs = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    nll = -log_probs.gather(-1, micro["input_ids"][:, 1:, None]).squeeze(-1)
    return (nll * valid).sum() / total_tokens * dp_size


def _total_tokens(batch: dict) -> float:
    return float((batch["attention_mask"][:, 1:] * batch["attention_mask"][:, :-1]).sum())


def _shard(batch: dict, dp_rank: int, dp_size: int, micro: int, uneven: bool = False) -> list[dict]:
    """This dp rank's rows in ``micro`` micro-batches; ``uneven``: the first holds one row, and every micro-batch
    loses its columns that are padding in all its rows (micro-batches of different shapes, as token-budget ones)."""
    rows = len(batch["input_ids"]) // dp_size
    mine = {k: v[dp_rank * rows : (dp_rank + 1) * rows] for k, v in batch.items()}
    if not uneven:
        size = rows // micro
        return [{k: v[i * size : (i + 1) * size] for k, v in mine.items()} for i in range(micro)]
    parts = [{k: v[:1] for k, v in mine.items()}, {k: v[1:] for k, v in mine.items()}]
    trimmed = []
    for part in parts:
        used = part["attention_mask"].any(0).nonzero().flatten()
        columns = slice(int(used[0]), int(used[-1]) + 1)
        trimmed.append({k: v[:, columns] for k, v in part.items()})
    return trimmed


def _fsdp_run(model_dir: str) -> dict:
    from verl.workers.engine.fsdp_engine import FSDPEngine

    batch, rank, world = _batch(), dist.get_rank(), dist.get_world_size()
    engine = FSDPEngine(model_dir, {"model_dtype": "fp32", "dtype": "fp32"}, {**OPTIM, "optimizer": "SGD"})
    total, loss_sum = _total_tokens(batch), 0.0
    for micro in _shard(batch, rank, world, 1):
        logits = engine.module(
            input_ids=micro["input_ids"], attention_mask=micro["attention_mask"], position_ids=micro["position_ids"]
        ).logits
        loss = _token_loss(logits, micro, total, world)
        loss.backward()
        loss_sum += float(loss.detach())
    norm = engine.clip_grad_norm_and_step(1.0)
    summed = torch.tensor(loss_sum)
    dist.all_reduce(summed)
    state = {name: t.clone() for name, t in engine.iter_hf_state_dict()}
    return {"loss": float(summed) / world, "grad_norm": norm, "state": state}


def _megatron_step(engine, batch: dict, micro: int) -> tuple[float, float]:
    total = _total_tokens(batch)

    def loss_fn(logits: torch.Tensor, mb: dict) -> tuple[torch.Tensor, dict]:
        loss = _token_loss(logits, mb, total, engine.dp_size)
        return loss, {"loss": float(loss)}

    uneven = engine.pp_size > 1  # the pipeline stages exchange micro-batches of different shapes
    results = engine.forward_backward(_shard(batch, engine.dp_rank, engine.dp_size, micro, uneven), loss_fn)
    norm = engine.clip_grad_norm_and_step(1.0)
    mine = sum(r["loss"] for r in results) if engine.is_collect_rank else 0.0
    summed = torch.tensor(mine)
    dist.all_reduce(summed)
    return float(summed) / engine.dp_size, norm


def _megatron_run(model_dir: str, tp: int, pp: int, sp: bool, dtype: str, ckpt: str | None) -> dict:
    from megatron.core import parallel_state as mpu

    from verl.workers.engine.megatron_engine import MegatronEngine

    config = {
        "tensor_model_parallel_size": tp,
        "pipeline_model_parallel_size": pp,
        "sequence_parallel": sp,
        "dtype": dtype,
        "use_distributed_optimizer": dtype == "bfloat16",
    }
    # Megatron's distributed optimizer is Adam only: that run's weights after the step are not compared to SGD's
    adam = {**OPTIM, "optimizer": "adam", "lr": 1e-3}
    engine = MegatronEngine(model_dir, config, adam if dtype == "bfloat16" else OPTIM)
    batch = _batch()
    initial = {name: t.clone() for name, t in engine.iter_hf_state_dict()}
    loss, norm = _megatron_step(engine, batch, micro=2)
    out = {"loss": loss, "grad_norm": norm, "state": dict(engine.iter_hf_state_dict()), "initial": initial}
    if ckpt is not None:
        engine.save_checkpoint(ckpt, hf_weights=True)
        # two more steps: the second's loss depends on the optimizer state the first left (Adam's moments)
        out["second"] = [_megatron_step(engine, batch, micro=2) for _ in range(2)]
        engine.load_checkpoint(ckpt)
        out["resumed"] = [_megatron_step(engine, batch, micro=2) for _ in range(2)]
    mpu.destroy_model_parallel()
    return out


def _values(model_dir: str) -> torch.Tensor | None:
    """A critic engine's values of the batch at tp2 × pp2 (with sequence parallelism), on the last stage's tp rank 0;
    None elsewhere."""
    from megatron.core import parallel_state as mpu

    from verl.workers.engine.megatron_engine import MegatronEngine

    config = {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2, "sequence_parallel": True}
    engine = MegatronEngine(model_dir, {**config, "dtype": "float32", "forward_only": True}, role="critic")
    with engine.eval_mode():
        results = engine.forward_backward([_batch()], lambda out, mb: (out.sum() * 0, {"v": out}), forward_only=True)
    mpu.destroy_model_parallel()
    return results[0]["v"] if engine.is_collect_rank else None


def _ranks(rank: int, model_dir: str, result_dir: str) -> None:
    values = _values(model_dir + "_value")
    if values is not None:
        torch.save(values, os.path.join(result_dir, "values.pt"))
    runs = {"fsdp": _fsdp_run(model_dir)}
    for name, (tp, pp, sp, dtype) in LAYOUTS.items():
        ckpt = os.path.join(result_dir, f"ckpt_{name}") if name in ("bf16", "tp2pp2") else None
        runs[name] = _megatron_run(model_dir, tp, pp, sp, dtype, ckpt)
    if rank == 0:
        torch.save(runs, os.path.join(result_dir, "runs.pt"))


@pytest.mark.timeout(600)
def test_megatron_layouts_match_each_other_and_fsdp(tmp_path):
    from safetensors.torch import load_file

    model_dir = str(tmp_path / "model")
    _make_model(model_dir)
    spawn_gloo(_ranks, 4, model_dir, str(tmp_path))
    runs = torch.load(tmp_path / "runs.pt", weights_only=False)
    hf = load_file(os.path.join(model_dir, "model.safetensors"))
    reference, tp1 = runs["fsdp"], runs["tp1pp1"]
    for name, run in runs.items():
        if name == "fsdp":
            continue
        if name == "bf16":  # bf16: the weights it loaded, cast; loss and gradient norm within bf16's precision
            assert all(torch.equal(run["initial"][k], t.to(torch.bfloat16)) for k, t in hf.items())
            assert run["loss"] == pytest.approx(reference["loss"], rel=1e-3)
            assert run["grad_norm"] == pytest.approx(reference["grad_norm"], rel=1e-2)
            continue
        # the converter is exact both ways: the engine gives back the HF weights it loaded, bit for bit
        assert set(run["initial"]) == set(hf), name
        for key, tensor in hf.items():
            assert torch.equal(run["initial"][key], tensor), (name, key)
        for other in (reference, tp1):  # the FSDP engine and the Megatron engine at tp1
            assert run["loss"] == pytest.approx(other["loss"], abs=1e-5), name
            assert run["grad_norm"] == pytest.approx(other["grad_norm"], abs=1e-5), name
            for key, tensor in other["state"].items():
                torch.testing.assert_close(run["state"][key], tensor, atol=1e-5, rtol=0, msg=f"{name} {key}")
    assert reference["grad_norm"] > 1.0  # the clip at 1.0 acted
    # the critic's value head on the split backbone: transformers' token-classification model's values
    from transformers import AutoModelForTokenClassification

    critic = AutoModelForTokenClassification.from_pretrained(model_dir + "_value", dtype=torch.float32)
    batch = _batch()
    with torch.no_grad():
        expected = critic(**batch).logits
    values, valid = torch.load(tmp_path / "values.pt"), batch["attention_mask"].bool()
    torch.testing.assert_close(values[valid], expected[valid], atol=1e-5, rtol=0)
    for name in ("bf16", "tp2pp2"):
        run = runs[name]
        assert run["resumed"] == run["second"], name  # bit-exact resume
        assert run["second"][1][0] < run["second"][0][0] < run["loss"], name
        folder = tmp_path / f"ckpt_{name}" / "huggingface"
        saved = load_file(str(folder / "model.safetensors"))
        for key, tensor in run["state"].items():
            assert torch.equal(saved[key], tensor), (name, key)
        assert json.loads((folder / "config.json").read_text())["model_type"] == "qwen2"
