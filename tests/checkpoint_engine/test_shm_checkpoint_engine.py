"""The ``shm`` weight push for real: the trainer's side in this process, the hf rollout engine in a Ray actor (another
process of the node), one shared file between them — bucketed, cast, versioned, verified bit for bit."""

from __future__ import annotations

import os
import sys

import pytest
import ray
import torch

from tests.ray_utils import wait_until_up
from verl.checkpoint_engine import WeightSyncError, get_checkpoint_engine, tensor_digest
from verl.checkpoint_engine.shm import (
    SharedWeightBuffer,
    ShmRolloutClient,
    ShmWeightReceiver,
    buffer_bytes,
    shm_path,
)
from verl.utils.tiny_model import build_tiny_qwen2

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

BUCKET_MB = 0.1  # the tiny model spans several buckets (its largest tensor, the embedding, is 64 KiB in bf16)
pytestmark = pytest.mark.timeout(600)  # the engine process's start counts against the first test (tests/ray_utils.py)


@ray.remote(num_cpus=0)
class RolloutProcess:
    """An hf rollout engine (bf16) in its own process, with the receiving end of a shared buffer."""

    def __init__(self, model_dir: str) -> None:
        from verl.workers.rollout import get_rollout_class

        config = {"name": "hf", "dtype": "bfloat16", "response_length": 8}
        self.rollout = get_rollout_class("hf")(config=config, model_path=model_dir)
        self.receiver: ShmWeightReceiver | None = None

    def attach(self, path: str, nbytes: int) -> int:
        self.receiver = ShmWeightReceiver(self.rollout, path, nbytes)
        return os.getpid()

    def call(self, method: str, *args):
        return getattr(self.receiver, method)(*args)

    def weight_version(self) -> int:
        return self.rollout.weight_version

    def digests(self) -> dict[str, str]:
        return {name: tensor_digest(t) for name, t in self.rollout.named_weights()}


@pytest.fixture(scope="module")
def engine_process(ray_cluster, tiny_model_dir):
    actor = RolloutProcess.remote(tiny_model_dir)
    wait_until_up([actor])
    yield actor
    ray.kill(actor)


def connect(actor, client_cls=ShmRolloutClient) -> tuple[ShmRolloutClient, int]:
    engine = get_checkpoint_engine({"backend": "shm", "update_weights_bucket_megabytes": BUCKET_MB}, dtype="bfloat16")
    client = client_cls(lambda method, *args: ray.get(actor.call.remote(method, *args)), nbytes=engine.bucket_bytes)
    pid = ray.get(actor.attach.remote(client.path, client.buffer.nbytes))
    return client, pid


def trainer_weights(seed: int = 7) -> dict[str, torch.Tensor]:
    return build_tiny_qwen2(seed=seed).state_dict()


def test_a_push_lands_in_the_other_process_bucketed_versioned_and_verified(engine_process):
    client, pid = connect(engine_process)
    assert pid != os.getpid() and client.path.startswith("/dev/shm/") and os.path.exists(client.path)
    engine = get_checkpoint_engine({"backend": "shm", "update_weights_bucket_megabytes": BUCKET_MB}, dtype="bfloat16")
    weights = trainer_weights()
    with client.weight_update(version=5):  # every bucket is one weight load: version 5 at the end
        stats = engine.send_weights(weights.items(), client, verify=True)
    assert stats["tensors"] == len(weights) and stats["buckets"] > 1
    assert stats["bytes"] == sum(t.numel() * 2 for t in weights.values())  # after the bf16 cast
    assert ray.get(engine_process.weight_version.remote()) == 5
    remote = ray.get(engine_process.digests.remote())
    for name, tensor in weights.items():  # the engine holds the trainer's tensors cast to bf16, bit for bit
        assert remote[name] == tensor_digest(tensor.to(torch.bfloat16)), name
    client.close()
    assert not os.path.exists(client.path)  # the trainer's side removes the file


class CorruptingClient(ShmRolloutClient):
    """Flips one value in the shared buffer after writing its bucket, before the other side reads it."""

    def update_weights(self, named_tensors):
        slots = self.buffer.write(named_tensors)
        for slot in slots:
            if slot.name == "model.layers.1.mlp.up_proj.weight":
                self.buffer.data[slot.offset] ^= 0xFF
        self.call("load", slots)


def test_verification_names_a_tensor_corrupted_in_transit(engine_process):
    client, _ = connect(engine_process, CorruptingClient)
    engine = get_checkpoint_engine({"backend": "shm", "update_weights_bucket_megabytes": BUCKET_MB}, dtype="bfloat16")
    with pytest.raises(WeightSyncError, match=r"1 tensor\(s\) differ: \['model.layers.1.mlp.up_proj.weight'\]"):
        with client.weight_update():
            engine.send_weights(trainer_weights().items(), client, verify=True)
    client.close()


def test_misuse_is_refused_by_name(tmp_path, tiny_model_dir):
    engine = get_checkpoint_engine({"backend": "shm", "update_weights_bucket_megabytes": 1}, dtype="bfloat16")
    with pytest.raises(TypeError, match="backend=shm pushes weights to a rollout engine in another process"):
        engine.send_weights(trainer_weights().items(), object())
    small = ShmRolloutClient(lambda *a: None, nbytes=1024, path=str(tmp_path / "small"))
    with pytest.raises(ValueError, match="does not fit the shared buffer of 1024 bytes"):
        engine.send_weights(trainer_weights().items(), small)  # buckets shrink to the buffer, a tensor cannot
    # a buffer holds one bucket, or the whole model when smaller, and at least the largest tensor (aligned sizes)
    assert buffer_bytes([100, 200], 2**20) == 128 + 256
    assert buffer_bytes([100, 5000], 1024) == 5056
    assert buffer_bytes([100] * 100, 1024) == 1024
    with pytest.raises(ValueError, match=r"weight 'big' \(4096 bytes at offset 0\) does not fit the shared buffer"):
        small.buffer.write([("big", torch.zeros(1024))])
    small.close()
    with pytest.raises(ValueError, match="1024 bytes, expected 2048"):
        open(tmp_path / "odd", "wb").write(b"\0" * 1024)
        SharedWeightBuffer(str(tmp_path / "odd"), 2048)
    from verl.workers.rollout import get_rollout_class

    rollout = get_rollout_class("hf")(config={"name": "hf", "response_length": 8}, model_path=tiny_model_dir)
    path = shm_path("test")
    owner = SharedWeightBuffer(path, 4096, create=True)
    receiver = ShmWeightReceiver(rollout, path, 4096)
    with pytest.raises(RuntimeError, match="load before begin"):
        receiver.load([])
    receiver.begin(3)
    with pytest.raises(RuntimeError, match="already open"):
        receiver.begin(4)
    assert receiver.end() == 3 and rollout.weight_version == 3
    receiver.close()
    owner.close()
