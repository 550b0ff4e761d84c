"""The ``gloo`` weight push for real: the trainer's side in this process (rank 0 of the push's own process group), two
hf rollout replicas in Ray actors (other processes), one broadcast per bucket — cast, versioned, verified bit for bit
in every replica, a replica that differs named."""

from __future__ import annotations

import os
import sys
import time

import pytest
import ray
import torch

from tests.ray_utils import wait_until_up
from verl.checkpoint_engine import WeightSyncError, get_checkpoint_engine, tensor_digest
from verl.checkpoint_engine.collective import (
    BroadcastReceiver,
    BroadcastSender,
    NotSending,
    StagedWeights,
    weight_group,
)
from verl.utils.net_utils import node_ip_and_free_port
from verl.utils.tiny_model import build_tiny_qwen2

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

BUCKET_MB = 0.1  # several buckets for the tiny model
REPLICAS = 2
CORRUPTED = "model.layers.1.mlp.up_proj.weight"
pytestmark = pytest.mark.timeout(600)  # the replicas' start counts against the first test (tests/ray_utils.py)


@ray.remote(num_cpus=0)
class Replica:
    """An hf rollout engine (bf16) in its own process, a receiving rank of the weight group."""

    def __init__(self, model_dir: str) -> None:
        from verl.workers.rollout import get_rollout_class

        config = {"name": "hf", "dtype": "bfloat16", "prompt_length": 8, "response_length": 4096, "ignore_eos": True}
        self.rollout = get_rollout_class("hf")(config=config, model_path=model_dir)
        self.receiver: BroadcastReceiver | None = None

    def join(self, host: str, port: int, rank: int, world: int) -> int:
        self.receiver = BroadcastReceiver(weight_group(host, port, rank, world, timeout_s=60), self.rollout)
        return os.getpid()

    def receive(self) -> int | None:
        return self.receiver.receive()

    def corrupt_loads(self) -> None:
        """From now on flip one value of one tensor as it is loaded (a faulty engine)."""
        load = self.rollout.update_weights

        def corrupted(named_tensors):
            named_tensors = [(n, t.clone()) for n, t in named_tensors]
            for name, tensor in named_tensors:
                if name == CORRUPTED:
                    tensor.view(-1)[0] += 1
            load(named_tensors)

        self.rollout.update_weights = corrupted

    def start_long_request(self) -> None:
        """A request of 4096 tokens, generating until aborted."""
        self.rollout.submit("long", [1, 2, 3], {"max_tokens": 4096, "temperature": 0.0})

    def generated(self) -> int:
        return self.rollout.progress("long") or 0

    def abort_long_request(self) -> list[int]:
        """Stop it; the weight version of each of its tokens."""
        return list(self.rollout.abort(["long"])["long"].weight_versions)

    def weight_version(self) -> int:
        return self.rollout.weight_version

    def digests(self) -> dict[str, str]:
        return {name: tensor_digest(t) for name, t in self.rollout.named_weights()}


@pytest.fixture(scope="module")
def pushed(ray_cluster, tiny_model_dir):
    """Two replicas and the trainer's sender, joined in one weight group."""
    replicas = [Replica.remote(tiny_model_dir) for _ in range(REPLICAS)]
    try:
        # up first (their engines built: slow on a loaded machine), so the group's timeout times the join alone
        wait_until_up(replicas)
        host, port = node_ip_and_free_port()
        joins = [r.join.remote(host, port, rank, REPLICAS + 1) for rank, r in enumerate(replicas, start=1)]
        sender = BroadcastSender(weight_group(host, port, 0, REPLICAS + 1, timeout_s=60))
        pids = ray.get(joins)
        yield sender, replicas, pids
        receives = [r.receive.remote() for r in replicas]
        sender.close()
        assert ray.get(receives) == [None] * REPLICAS  # closed: no push follows
    finally:  # a failed set-up leaves no replica blocked in a join behind it
        for replica in replicas:
            ray.kill(replica)


def push(sender, replicas, version: int, verify: bool = True) -> tuple[dict, list]:
    engine = get_checkpoint_engine({"backend": "gloo", "update_weights_bucket_megabytes": BUCKET_MB}, dtype="bfloat16")
    receives = [r.receive.remote() for r in replicas]  # each replica takes part in the push
    try:
        with sender.weight_update(version=version):
            stats = engine.send_weights(build_tiny_qwen2(seed=7).state_dict().items(), sender, verify=verify)
    finally:
        versions = ray.get(receives)
    return stats, versions


def test_a_push_reaches_every_replica_bucketed_versioned_and_verified(pushed):
    sender, replicas, pids = pushed
    assert os.getpid() not in pids and len(set(pids)) == REPLICAS
    stats, versions = push(sender, replicas, version=3)
    weights = build_tiny_qwen2(seed=7).state_dict()
    assert versions == [3, 3] and stats["buckets"] > 1 and stats["tensors"] == len(weights)
    assert stats["bytes"] == sum(t.numel() * 2 for t in weights.values())  # after the bf16 cast
    for replica in replicas:  # every replica holds the trainer's tensors cast to bf16, bit for bit
        remote = ray.get(replica.digests.remote())
        assert all(remote[name] == tensor_digest(t.to(torch.bfloat16)) for name, t in weights.items())


def test_a_push_lands_between_the_decode_steps_of_a_generating_replica(pushed):
    # the trainer does not wait for the replicas' requests: the push takes the engine between two decode steps, the
    # request goes on with the new weights, and each token keeps the version that sampled it
    sender, replicas, _ = pushed
    ray.get(replicas[0].start_long_request.remote())
    deadline = time.monotonic() + 60
    while ray.get(replicas[0].generated.remote()) < 8:  # decoding: the push must land mid-request
        assert time.monotonic() < deadline, "the long request did not reach 8 tokens in 60 s"
        time.sleep(0.05)
    before = ray.get(replicas[0].weight_version.remote())
    _, versions = push(sender, replicas, version=before + 1, verify=False)
    assert versions == [before + 1] * REPLICAS
    after_push = ray.get(replicas[0].generated.remote())
    while ray.get(replicas[0].generated.remote()) < after_push + 2:  # a token sampled under the new weights
        assert time.monotonic() < deadline + 60, "the long request made no progress after the push"
        time.sleep(0.05)
    tokens = ray.get(replicas[0].abort_long_request.remote())
    assert tokens[0] == before and tokens[-1] == before + 1 and tokens == sorted(tokens), tokens[:4]


def test_a_replica_that_differs_is_named(pushed):
    sender, replicas, _ = pushed
    ray.get(replicas[1].corrupt_loads.remote())
    version = ray.get(replicas[0].weight_version.remote()) + 1
    with pytest.raises(WeightSyncError, match=rf"rollout replica 2 .*1 tensor\(s\) differ \['{CORRUPTED}'\]"):
        push(sender, replicas, version=version)
    assert ray.get([r.weight_version.remote() for r in replicas]) == [version] * 2  # the push itself completed


def test_misuse_is_refused_by_name(pushed):
    sender, _, _ = pushed
    engine = get_checkpoint_engine({"backend": "gloo"}, dtype="bfloat16")
    with pytest.raises(TypeError, match="backend=gloo broadcasts weights to rollout replicas in other processes"):
        engine.send_weights(build_tiny_qwen2().state_dict().items(), object())
    with pytest.raises(ValueError, match="a BroadcastReceiver is rank 1 or more"):
        BroadcastReceiver(sender.group, rollout=None)
    with pytest.raises(ValueError, match="the collective push is 'gloo' or 'nccl'"):
        weight_group("127.0.0.1", 1, 0, 1, backend="mpi", timeout_s=1)


def test_staged_versions_wait_beside_the_engine_until_one_is_loaded(tiny_model_dir):
    """A replica of ``separate_async`` stages each push (a receiver writes into `StagedWeights` as into an engine)
    and loads the version it is told to, verified against the staged tensors; older versions go then."""
    from verl.workers.rollout import get_rollout_class

    config = {"name": "hf", "dtype": "bfloat16", "prompt_length": 8, "response_length": 8}
    engine = get_rollout_class("hf")(config=config, model_path=tiny_model_dir)
    staged = StagedWeights()
    pushes = {v: build_tiny_qwen2(seed=v).to(torch.bfloat16).state_dict() for v in (1, 2)}
    for version, weights in pushes.items():
        with staged.weight_update(version):
            staged.update_weights(list(weights.items())[:3])  # two buckets
            staged.update_weights(list(weights.items())[3:])
    assert sorted(staged.versions) == [1, 2] and staged.weight_version == 2 and engine.weight_version == 0
    staged.apply(engine, 2, verify=True, drop_older=False)  # validation: the newest, the older one kept
    assert engine.weight_version == 2 and sorted(staged.versions) == [1, 2]
    staged.apply(engine, 1, verify=True)  # the rollouter goes on with the version its groups need
    digests = {name: tensor_digest(t) for name, t in engine.named_weights()}
    assert engine.weight_version == 1 and all(digests[n] == tensor_digest(t) for n, t in pushes[1].items())
    assert sorted(staged.versions) == [1, 2]  # nothing older than 1 to drop
    staged.apply(engine, 2)
    assert sorted(staged.versions) == [2]
    with pytest.raises(WeightSyncError, match=r"weight version 1 is not staged in this replica \(staged: \[2\]\)"):
        staged.apply(engine, 1)
    with pytest.raises(RuntimeError, match="outside weight_update"):
        staged.update_weights([])
    load = engine.update_weights

    def corrupted(named_tensors):  # a faulty load: the check against the staged tensors names the tensor
        named_tensors = [(n, t.clone()) for n, t in named_tensors]
        for name, tensor in named_tensors:
            if name == CORRUPTED:
                tensor.view(-1)[0] += 1
        load(named_tensors)

    engine.update_weights = corrupted
    with pytest.raises(WeightSyncError, match=CORRUPTED):
        staged.apply(engine, 2, verify=True)
    nothing = NotSending()  # a trainer rank other than the sender's drops what it gathered
    with nothing.weight_update(3):
        nothing.update_weights(pushes[1].items())
    assert nothing.replica_digests() == []
