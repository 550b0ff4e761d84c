"""``shm``: the weight push between two processes of one node, through one preallocated file in shared memory.

The trainer's process (a :class:`ShmRolloutClient`) writes each bucket of tensors, cast to the rollout dtype, into a
file under ``/dev/shm`` that both processes map (``torch.from_file(path, shared=True)``), then sends a small message
— where each tensor lies (:class:`TensorSlot`: name, dtype, shape, byte offset) — to the rollout's process (a
:class:`ShmWeightReceiver`), which loads views of its own mapping into its engine; the next bucket reuses the space.
All buckets of one push are one weight load: the receiver holds its engine still from ``begin`` to ``end`` and the
engine's weight version becomes the push's version. Verification digests the engine's tensors where they live
(``weight_digests``) and compares them with the trainer's, bit for bit, as the in-process backend does.

The file is created and removed by the trainer's side; the rollout's side only maps it. (``multiprocessing.
shared_memory`` is avoided on purpose: on Python 3.11 the attaching process's resource tracker can unlink a segment
the other process still uses.)

Where the message travels is the caller's choice: ``call(method, *args)`` runs the receiver's method in the other
process and returns its result (a Ray actor call in the trainer).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from verl.checkpoint_engine.base import ColocatedCheckpointEngine, register_checkpoint_engine, tensor_digest

__all__ = [
    "SharedMemoryCheckpointEngine",
    "SharedWeightBuffer",
    "ShmRolloutClient",
    "ShmWeightReceiver",
    "TensorSlot",
    "buffer_bytes",
    "shm_path",
]

ALIGN = 64  # every tensor starts at a multiple of 64 bytes (the CPU kernels' alignment)
SHM_DIR = "/dev/shm"


def aligned(nbytes: int) -> int:
    """``nbytes`` rounded up to the alignment every tensor of a flat weight buffer starts at."""
    return -(-int(nbytes) // ALIGN) * ALIGN


def layout(tensors: Iterable[tuple[str, torch.Tensor]]) -> tuple[list[TensorSlot], int]:
    """Where each (contiguous) tensor goes in a flat ``uint8`` buffer, one after the other at aligned offsets, and the
    bytes they span."""
    slots, offset = [], 0
    for name, tensor in tensors:
        nbytes = tensor.numel() * tensor.element_size()
        slots.append(TensorSlot(name, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape), offset, nbytes))
        offset += aligned(nbytes)
    return slots, offset


def copy_in(data: torch.Tensor, slots: Iterable[TensorSlot], tensors: Iterable[torch.Tensor]) -> None:
    """Copy ``tensors`` into the flat buffer ``data`` at their ``slots``."""
    for slot, tensor in zip(slots, tensors):
        data[slot.offset : slot.offset + slot.nbytes].copy_(tensor.reshape(-1).view(torch.uint8))


def views(data: torch.Tensor, slots: Iterable[TensorSlot]) -> list[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` views of the flat buffer ``data`` for ``slots``."""
    return [(s.name, data[s.offset : s.offset + s.nbytes].view(getattr(torch, s.dtype)).view(s.shape)) for s in slots]


def buffer_bytes(sizes: Iterable[int], bucket_bytes: int) -> int:
    """The size of a shared buffer for tensors of ``sizes`` bytes pushed in buckets of ``bucket_bytes``: one bucket,
    or the whole model at its aligned size when that is smaller, and never less than the largest tensor."""
    aligned_sizes = [aligned(n) for n in sizes]
    if not aligned_sizes:
        raise ValueError("a shared weight buffer for a model without tensors")
    return max(max(aligned_sizes), min(int(bucket_bytes), sum(aligned_sizes)))


def shm_path(tag: str = "weights") -> str:
    """A fresh file name for a shared buffer (``/dev/shm`` when the machine has it, else the temp folder)."""
    import tempfile

    folder = SHM_DIR if os.path.isdir(SHM_DIR) else tempfile.gettempdir()
    return os.path.join(folder, f"verl-{tag}-{os.getpid()}-{uuid.uuid4().hex[:8]}")


@dataclass(frozen=True)
class TensorSlot:
    """Where one tensor lies in the shared buffer."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


class SharedWeightBuffer:
    """``nbytes`` of a file mapped as one ``uint8`` tensor, shared with every process that maps the same file.

    Args:
        path: the file (see :func:`shm_path`).
        nbytes: its size.
        create: make the file (the trainer's side; it also removes it in :meth:`close`), else map an existing one.
    """

    def __init__(self, path: str, nbytes: int, create: bool = False) -> None:
        if nbytes <= 0:
            raise ValueError(f"a shared weight buffer needs a positive size, got {nbytes}")
        self.path, self.nbytes, self.owner = path, int(nbytes), create
        if create:
            with open(path, "wb") as f:
                f.truncate(self.nbytes)
        elif os.path.getsize(path) != self.nbytes:
            raise ValueError(f"shared weight buffer {path}: {os.path.getsize(path)} bytes, expected {self.nbytes}")
        self.data = torch.from_file(path, shared=True, size=self.nbytes, dtype=torch.uint8)

    def write(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> list[TensorSlot]:
        """Copy the tensors in, one after the other at aligned offsets; returns their slots."""
        tensors = [(name, tensor.detach().contiguous()) for name, tensor in named_tensors]
        slots, _ = layout(tensors)
        for slot in slots:
            if slot.offset + slot.nbytes > self.nbytes:
                raise ValueError(
                    f"weight {slot.name!r} ({slot.nbytes} bytes at offset {slot.offset}) does not fit the shared "
                    f"buffer of {self.nbytes} bytes: raise rollout.checkpoint_engine.update_weights_bucket_megabytes"
                )
        copy_in(self.data, slots, (tensor for _, tensor in tensors))
        return slots

    def read(self, slots: Iterable[TensorSlot]) -> list[tuple[str, torch.Tensor]]:
        """Views of the buffer for ``slots`` (valid until the buffer is written again)."""
        return views(self.data, slots)

    def unlink(self) -> None:
        """Remove the file's name (the creating side, once every process has mapped it): the mappings stay valid
        and the memory goes when the last one does, so a process that dies leaves nothing in ``/dev/shm``."""
        if self.owner:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)

    def close(self) -> None:
        """Drop the mapping; the creating side also removes the file."""
        self.data = None
        self.unlink()


class ShmWeightReceiver:
    """The rollout process's end: maps the trainer's file and loads each bucket into ``rollout``.

    ``begin`` → ``load`` (per bucket) → ``end`` run on one thread of the receiver's own, so the engine is held still
    across the calls (its lock belongs to a thread) whichever thread delivers them.

    Args:
        rollout: the rollout engine (``weight_update``, ``update_weights``, ``named_weights``).
        path / nbytes: the trainer's shared buffer.
    """

    def __init__(self, rollout: Any, path: str, nbytes: int) -> None:
        self.rollout = rollout
        self.buffer = SharedWeightBuffer(path, nbytes)
        self._thread = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="shm-weights")
        self._update: contextlib.AbstractContextManager | None = None

    def _on_thread(self, fn: Callable[[], Any]) -> Any:
        return self._thread.submit(fn).result()

    def begin(self, version: int | None = None) -> None:
        """Hold the engine still for one weight load that ends with version ``version`` (None: +1)."""

        def enter() -> None:
            if self._update is not None:
                raise RuntimeError("a shared-memory weight load is already open (begin without end)")
            update = self.rollout.weight_update(version)
            update.__enter__()
            self._update = update

        self._on_thread(enter)

    def load(self, slots: list[TensorSlot]) -> None:
        """Load one bucket: the tensors ``slots`` locate in the shared buffer (the engine copies them)."""

        def copy() -> None:
            if self._update is None:
                raise RuntimeError("load before begin: a shared-memory weight load is not open")
            self.rollout.update_weights(self.buffer.read(slots))

        self._on_thread(copy)

    def end(self) -> int:
        """Close the load (the engine takes the new version); returns that version."""

        def exit_() -> int:
            update, self._update = self._update, None
            if update is not None:
                update.__exit__(None, None, None)
            return int(getattr(self.rollout, "weight_version", 0))

        return self._on_thread(exit_)

    def weight_digests(self) -> dict[str, str]:
        """Digests of the engine's weights, computed here (nothing travels back but the digests)."""
        return self._on_thread(lambda: {name: tensor_digest(t) for name, t in self.rollout.named_weights()})

    def close(self) -> None:
        self._thread.shutdown()
        self.buffer.close()


class ShmRolloutClient:
    """The trainer process's end, a rollout engine as far as a checkpoint engine is concerned (``update_weights``,
    ``weight_update``, ``weight_digests``): each bucket goes into the shared buffer, then one message to the
    receiver, which has finished with it when the call returns.

    Args:
        call: ``call(method, *args)`` runs :class:`ShmWeightReceiver`'s ``method`` in the rollout's process and
            returns its result.
        nbytes: the buffer's size (at least one bucket).
        path: its file (default: a fresh name under ``/dev/shm``).
    """

    def __init__(self, call: Callable[..., Any], nbytes: int, path: str | None = None) -> None:
        self.call = call
        self.buffer = SharedWeightBuffer(path or shm_path(), nbytes, create=True)

    @property
    def path(self) -> str:
        return self.buffer.path

    def connect(self) -> None:
        """Have the receiver map the buffer (``call("open", path, nbytes)``), then remove the file's name: from
        here on only the two mappings hold the memory."""
        self.call("open", self.path, self.buffer.nbytes)
        self.buffer.unlink()

    @contextlib.contextmanager
    def weight_update(self, version: int | None = None) -> Iterator[None]:
        """One weight load in the rollout's process (every bucket sent inside it), ending at ``version``."""
        self.call("begin", version)
        try:
            yield
        finally:
            self.call("end")

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.call("load", self.buffer.write(named_tensors))

    def weight_digests(self) -> dict[str, str]:
        return self.call("weight_digests")

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        raise NotImplementedError("the engine's weights live in another process: use weight_digests()")

    def close(self) -> None:
        self.buffer.close()


@register_checkpoint_engine("shm")
class SharedMemoryCheckpointEngine(ColocatedCheckpointEngine):
    """``shm``: the bucketed, cast, verified push of the in-process backend, into a rollout engine of another process
    of the node through a :class:`ShmRolloutClient`: buckets of ``update_weights_bucket_megabytes`` or of the
    client's buffer when that is smaller (:func:`buffer_bytes` sizes it to the model when the model is smaller than
    a bucket); tensors are counted at their aligned size."""

    @staticmethod
    def footprint(nbytes: int) -> int:
        return aligned(nbytes)

    def bucket_limit(self, rollout: Any) -> int:
        return min(self.bucket_bytes, rollout.buffer.nbytes)

    def send_weights(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], rollout: Any, verify: bool = False
    ) -> dict[str, float]:
        if not isinstance(rollout, ShmRolloutClient):
            raise TypeError(
                "rollout.checkpoint_engine.backend=shm pushes weights to a rollout engine in another process; it got "
                f"{type(rollout).__name__} (an engine in this process: use backend=naive)"
            )
        return super().send_weights(named_tensors, rollout, verify=verify)
