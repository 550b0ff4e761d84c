"""``gloo`` / ``nccl``: the weight push from a trainer process to rollout replicas in other processes, on this node or
others, over a torch.distributed process group of its own (veRL's disaggregated ``nccl`` backend; ``gloo`` on CPU).

The group is made for the push alone (:func:`weight_group`: a ``TCPStore`` at an address the trainer's side
publishes, rank 0 the sender, ranks 1..R the replicas), apart from the trainer's and the replicas' own groups. A push
is a stream of broadcasts from rank 0: a header (a pickled message) and, for each bucket, one flat buffer of the
bucket's tensors, cast to the rollout dtype, at 64-byte-aligned offsets (:class:`~verl.checkpoint_engine.shm.
TensorSlot` s locate them). Every replica loads views of the buffer into its engine; all buckets of one push are
one weight load ending at the push's version. Verification gathers each replica's digests of its engine's weights
to the sender, which compares them with the trainer's, bit for bit, and names the replica that differs.

The sender (:class:`BroadcastSender`) is a rollout engine as far as a checkpoint engine is concerned
(``weight_update`` / ``update_weights`` / ``weight_digests``); each replica runs :meth:`BroadcastReceiver.receive`
for the length of a push (its Ray call is made before the trainer's push and returns when the push ends).
"""

from __future__ import annotations

import contextlib
import datetime
import pickle
from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist

from verl.checkpoint_engine.base import (
    ColocatedCheckpointEngine,
    WeightSyncError,
    register_checkpoint_engine,
    tensor_digest,
)
from verl.checkpoint_engine.shm import TensorSlot, aligned, copy_in, layout, views

__all__ = [
    "BroadcastReceiver",
    "BroadcastSender",
    "CollectiveCheckpointEngine",
    "NotSending",
    "StagedWeights",
    "weight_group",
]

SENDER = 0


def weight_group(
    host: str, port: int, rank: int, world_size: int, backend: str = "gloo", timeout_s: float = 600.0
) -> Any:
    """The push's own process group: rank 0 (the sender) hosts the ``TCPStore`` at ``host:port``; every rank calls
    this with the same address, size and backend (``gloo`` on CPU, ``nccl`` between GPUs)."""
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"rollout.checkpoint_engine.backend={backend!r}: the collective push is 'gloo' or 'nccl'")
    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.TCPStore(host, port, world_size, is_master=rank == SENDER, timeout=timeout)
    prefixed = dist.PrefixStore(f"verl-weights-{backend}", store)
    if backend == "gloo":
        return dist.ProcessGroupGloo(prefixed, rank, world_size, timeout)
    return dist.ProcessGroupNCCL(prefixed, rank, world_size)  # not exercised here: no GPU


def _broadcast(group: Any, tensor: torch.Tensor) -> None:
    opts = dist.BroadcastOptions()
    opts.rootRank = SENDER
    group.broadcast([tensor], opts).wait()


def _broadcast_message(group: Any, message: Any, device: str) -> Any:
    """Rank 0's ``message`` (pickled), on every rank."""
    if group.rank() == SENDER:
        data = torch.frombuffer(bytearray(pickle.dumps(message)), dtype=torch.uint8).to(device)
        size = torch.tensor([data.numel()], dtype=torch.int64, device=device)
    else:
        size = torch.zeros(1, dtype=torch.int64, device=device)
    _broadcast(group, size)
    if group.rank() != SENDER:
        data = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    _broadcast(group, data)
    return message if group.rank() == SENDER else pickle.loads(data.cpu().numpy().tobytes())


def _gather_messages(group: Any, message: Any, device: str) -> list[Any]:
    """Every rank's ``message`` at rank 0 (in rank order, rank 0's first); [] elsewhere."""
    data = torch.frombuffer(bytearray(pickle.dumps(message)), dtype=torch.uint8).to(device)
    sizes = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(group.size())]
    group.allgather([sizes], [torch.tensor([data.numel()], dtype=torch.int64, device=device)]).wait()
    longest = max(int(s.item()) for s in sizes)
    padded = torch.zeros(longest, dtype=torch.uint8, device=device)
    padded[: data.numel()] = data
    if group.rank() == SENDER:
        out = [torch.empty(longest, dtype=torch.uint8, device=device) for _ in range(group.size())]
        opts = dist.GatherOptions()
        opts.rootRank = SENDER
        group.gather([out], [padded], opts).wait()
        return [pickle.loads(t[: int(s.item())].cpu().numpy().tobytes()) for t, s in zip(out, sizes)]
    opts = dist.GatherOptions()
    opts.rootRank = SENDER
    group.gather([], [padded], opts).wait()
    return []


def _pack(named_tensors: Iterable[tuple[str, torch.Tensor]], device: str) -> tuple[list[TensorSlot], torch.Tensor]:
    """One flat ``uint8`` buffer holding the tensors at aligned offsets, and their slots."""
    tensors = [(name, t.detach().contiguous()) for name, t in named_tensors]
    slots, nbytes = layout(tensors)
    flat = torch.empty(nbytes, dtype=torch.uint8, device=device)
    copy_in(flat, slots, (t for _, t in tensors))
    return slots, flat


class BroadcastSender:
    """The trainer's end (rank 0 of a :func:`weight_group`): a push as broadcasts to every replica.

    Args:
        group: the push's process group.
        device: where the buffers live (``cpu`` for gloo, the GPU for nccl).
    """

    def __init__(self, group: Any, device: str = "cpu") -> None:
        if group.rank() != SENDER:
            raise ValueError(f"a BroadcastSender is rank {SENDER} of its weight group, not rank {group.rank()}")
        self.group, self.device = group, device

    @property
    def replicas(self) -> int:
        return self.group.size() - 1

    @contextlib.contextmanager
    def weight_update(self, version: int | None = None) -> Iterator[None]:
        """One weight load in every replica (every bucket sent inside it), ending at ``version``."""
        _broadcast_message(self.group, ("begin", version), self.device)
        try:
            yield
        finally:
            _broadcast_message(self.group, ("end", None), self.device)

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        slots, flat = _pack(named_tensors, self.device)
        _broadcast_message(self.group, ("bucket", (slots, flat.numel())), self.device)
        _broadcast(self.group, flat)

    def replica_digests(self) -> list[dict[str, str]]:
        """Each replica's digests of its engine's weights, in replica order."""
        _broadcast_message(self.group, ("digests", None), self.device)
        return _gather_messages(self.group, {}, self.device)[1:]

    def close(self) -> None:
        """Tell the replicas that no push will follow (their ``receive`` returns None)."""
        _broadcast_message(self.group, ("close", None), self.device)


class NotSending:
    """The push's end on a trainer rank other than the sender's: a sharded trainer's every rank gathers the full
    tensors together, and only rank 0 broadcasts them; here they are dropped."""

    replicas = 0

    @contextlib.contextmanager
    def weight_update(self, version: int | None = None) -> Iterator[None]:
        yield

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        for _ in named_tensors:
            pass

    def replica_digests(self) -> list[dict[str, str]]:
        return []


class StagedWeights:
    """A replica's received weight versions, held beside its engine until :meth:`apply` loads one: a push then never
    waits for the engine's requests in flight, and the replica chooses when each version starts generating. A
    :class:`BroadcastReceiver` writes into it as into an engine (``weight_update`` / ``update_weights`` /
    ``named_weights``: the digests of a verified push are those of the newest staged version)."""

    def __init__(self) -> None:
        self.versions: dict[int, list[tuple[str, torch.Tensor]]] = {}
        self._receiving: int | None = None

    @contextlib.contextmanager
    def weight_update(self, version: int | None = None) -> Iterator[None]:
        if version is None:
            raise ValueError("a staged weight push needs its version")
        self._receiving = int(version)
        self.versions[self._receiving] = []
        try:
            yield
        except BaseException:
            self.versions.pop(self._receiving, None)  # a push that failed part-way is not a version
            raise
        finally:
            self._receiving = None

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        if self._receiving is None:
            raise RuntimeError("StagedWeights.update_weights outside weight_update(version)")
        self.versions[self._receiving].extend(named_tensors)

    @property
    def weight_version(self) -> int | None:
        """The newest staged version (None: nothing staged)."""
        return max(self.versions, default=None)

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        newest = self.weight_version
        return iter(self.versions.get(newest, []) if newest is not None else [])

    def apply(self, rollout: Any, version: int, verify: bool = False, drop_older: bool = True) -> None:
        """Load staged ``version`` into ``rollout`` as that version (and drop the versions before it unless
        ``drop_older`` is false); with ``verify`` the engine's weights must then equal the staged tensors bit for
        bit."""
        if version not in self.versions:
            raise WeightSyncError(
                f"weight version {version} is not staged in this replica (staged: {sorted(self.versions)})"
            )
        tensors = self.versions[version]
        with rollout.weight_update(version):
            rollout.update_weights(tensors)
        if verify:
            ColocatedCheckpointEngine.verify(rollout, {name: tensor_digest(t) for name, t in tensors})
        for old in [v for v in self.versions if v < version and drop_older]:
            del self.versions[old]


class BroadcastReceiver:
    """A replica's end (rank ≥ 1 of a :func:`weight_group`): loads what the sender broadcasts into ``rollout``.

    Args:
        group: the push's process group.
        rollout: the rollout engine (``weight_update``, ``update_weights``, ``named_weights``).
        device: where the buffers live.
    """

    def __init__(self, group: Any, rollout: Any, device: str = "cpu") -> None:
        if group.rank() == SENDER:
            raise ValueError(f"rank {SENDER} of a weight group sends; a BroadcastReceiver is rank 1 or more")
        self.group, self.rollout, self.device = group, rollout, device

    def receive(self) -> int | None:
        """Take part in one push, from its ``begin`` to its ``end``; returns the engine's new version (None: the
        sender closed the group)."""
        update = None
        try:
            while True:
                kind, payload = _broadcast_message(self.group, None, self.device)
                if kind == "close":
                    return None
                if kind == "begin":
                    update = self.rollout.weight_update(payload)
                    update.__enter__()
                elif kind == "bucket":
                    slots, nbytes = payload
                    flat = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
                    _broadcast(self.group, flat)
                    self.rollout.update_weights(views(flat, slots))
                elif kind == "digests":
                    digests = {name: tensor_digest(t) for name, t in self.rollout.named_weights()}
                    _gather_messages(self.group, digests, self.device)
                elif kind == "end":
                    update, entered = None, update
                    if entered is not None:
                        entered.__exit__(None, None, None)
                    return int(getattr(self.rollout, "weight_version", 0))
                else:
                    raise RuntimeError(f"weight push: unknown message {kind!r} from the sender")
        finally:
            if update is not None:  # a failure inside the push: release the engine
                update.__exit__(None, None, None)


@register_checkpoint_engine("gloo")
class CollectiveCheckpointEngine(ColocatedCheckpointEngine):
    """``gloo`` (and ``nccl`` on GPUs): the bucketed, cast push of the in-process backend, broadcast through a
    :class:`BroadcastSender` to every replica; verification checks each replica's digests and names the one that
    differs."""

    def send_weights(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], rollout: Any, verify: bool = False
    ) -> dict[str, float]:
        if not isinstance(rollout, BroadcastSender | NotSending):
            raise TypeError(
                "rollout.checkpoint_engine.backend=gloo broadcasts weights to rollout replicas in other processes; "
                f"it got {type(rollout).__name__} (an engine in this process: use backend=naive)"
            )
        return super().send_weights(named_tensors, rollout, verify=verify)

    @staticmethod
    def footprint(nbytes: int) -> int:
        return aligned(nbytes)

    @staticmethod
    def verify(rollout: Any, expected: dict[str, str]) -> None:
        for replica, actual in enumerate(rollout.replica_digests(), start=1):
            missing = sorted(set(expected) - set(actual))
            differ = sorted(n for n in expected if n in actual and actual[n] != expected[n])
            if missing or differ:
                raise WeightSyncError(
                    f"rollout replica {replica} (rank {replica} of the weight group) differs from the trainer after "
                    f"the push: {len(differ)} tensor(s) differ {differ[:8]}, {len(missing)} missing {missing[:8]}"
                )


register_checkpoint_engine("nccl")(CollectiveCheckpointEngine)
