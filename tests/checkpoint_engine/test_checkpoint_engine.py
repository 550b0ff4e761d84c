"""Weight sync into the real hf rollout engine: bucketed, cast, and verified bit for bit."""

from __future__ import annotations

import pytest
import torch

from verl.checkpoint_engine import (
    CheckpointEngineRegistry,
    ColocatedCheckpointEngine,
    WeightSyncError,
    get_checkpoint_engine,
    register_checkpoint_engine,
    tensor_digest,
)
from verl.utils.tiny_model import build_tiny_qwen2
from verl.workers.rollout import get_rollout_class


@pytest.fixture()
def rollout(tiny_model_dir):
    return get_rollout_class("hf")(
        config={"name": "hf", "dtype": "bfloat16", "response_length": 8}, model_path=tiny_model_dir
    )


def trainer_weights(seed: int = 7):
    """A differently initialized 'trained' model in float32: what the trainer would send."""
    return build_tiny_qwen2(seed=seed).state_dict()


def test_sync_casts_buckets_and_verifies(rollout):
    weights = trainer_weights()
    engine = get_checkpoint_engine({"backend": "naive", "update_weights_bucket_megabytes": 0.05}, dtype="bfloat16")
    stats = engine.send_weights(weights.items(), rollout, verify=True)
    assert stats["tensors"] == len(weights) and stats["buckets"] > 1  # 0.05 MiB buckets: the model spans several
    assert stats["bytes"] == sum(t.numel() * 2 for t in weights.values())  # counted after the bf16 cast
    engine_weights = dict(rollout.named_weights())
    for name, tensor in weights.items():
        assert torch.equal(engine_weights[name], tensor.to(torch.bfloat16)), name


def test_verification_catches_a_corrupted_tensor(rollout, monkeypatch):
    real_update = rollout.update_weights

    def corrupting_update(named_tensors):
        out = []
        for name, tensor in named_tensors:
            if name == "model.layers.1.mlp.up_proj.weight":
                tensor = tensor.clone()
                tensor[0, 0] += 1.0  # one flipped value in transit
            out.append((name, tensor))
        real_update(out)

    monkeypatch.setattr(rollout, "update_weights", corrupting_update)
    engine = ColocatedCheckpointEngine(bucket_megabytes=1, dtype=torch.bfloat16)
    with pytest.raises(WeightSyncError, match=r"1 tensor\(s\) differ: \['model.layers.1.mlp.up_proj.weight'\]"):
        engine.send_weights(trainer_weights().items(), rollout, verify=True)
    # without verification the corruption goes unnoticed, which is why tests always verify
    engine.send_weights(trainer_weights().items(), rollout, verify=False)


def test_a_tensor_the_engine_does_not_hold_is_reported(rollout):
    weights = list(trainer_weights().items())
    digests = {name: tensor_digest(t.to(torch.bfloat16)) for name, t in weights}
    digests["model.extra.weight"] = "0" * 32
    ColocatedCheckpointEngine(dtype="bf16").send_weights(weights, rollout)
    with pytest.raises(WeightSyncError, match=r"not in the engine: \['model.extra.weight'\]"):
        ColocatedCheckpointEngine.verify(rollout, digests)


def test_digest_sees_dtype_shape_and_bytes():
    t = torch.arange(6, dtype=torch.float32)
    assert tensor_digest(t) == tensor_digest(t.clone())
    assert tensor_digest(t) != tensor_digest(t.reshape(2, 3))
    assert tensor_digest(t) != tensor_digest(t.to(torch.float64))
    u = t.clone()
    u[3] = torch.nextafter(u[3], torch.tensor(10.0))  # one ulp
    assert tensor_digest(t) != tensor_digest(u)


def test_registry_and_config_errors():
    unknown = r"unknown rollout.checkpoint_engine.backend 'nixl'; registered: \['gloo', 'naive', 'nccl', 'shm'\]"
    with pytest.raises(ValueError, match=unknown):
        get_checkpoint_engine({"backend": "nixl"})
    with pytest.raises(ValueError, match="must be positive"):
        get_checkpoint_engine({"update_weights_bucket_megabytes": 0})
    with pytest.raises(ValueError, match="rollout dtype: unknown dtype"):
        ColocatedCheckpointEngine(dtype="int8")
    with pytest.raises(ValueError, match="already registered"):
        register_checkpoint_engine("naive")(type("Other", (ColocatedCheckpointEngine,), {}))
    assert CheckpointEngineRegistry.get("naive") is ColocatedCheckpointEngine
