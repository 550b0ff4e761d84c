"""RayWorkerGroup end to end: real Ray actors forming a real gloo process group."""

from __future__ import annotations

import os
import signal
import sys
import time

import numpy as np
import pytest
import ray
import torch
import torch.distributed as dist

from verl.protocol import DataProto, DataProtoFuture, all_gather_data_proto
from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import (
    Dispatch,
    Execute,
    make_nd_compute_dataproto_dispatch_fn,
    register,
)
from verl.single_controller.ray import (
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    WorkerDiedError,
    create_colocated_worker_cls,
)
from verl.single_controller.ray.health import placement, raise_if_workers_died
from verl.utils.distributed import initialize_global_process_group

# Test modules are not importable inside Ray workers: ship their classes by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


class ScaleWorker(Worker):
    """Multiplies rows by ``scale``; sums across ranks with a gloo all-reduce."""

    def __init__(self, scale: float, gloo_timeout_s: int = 120) -> None:
        super().__init__()
        self.scale = scale
        initialize_global_process_group(timeout_second=gloo_timeout_s)
        # a toy 2-d mesh: ranks (0, 1) form dp rank 0, (2, 3) dp rank 1, ... ; only the first of each collects
        self._register_dispatch_collect_info("pairs", dp_rank=self.rank // 2, is_collect=self.rank % 2 == 0)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def env(self) -> dict:
        keys = (
            "WORLD_SIZE",
            "RANK",
            "LOCAL_RANK",
            "LOCAL_WORLD_SIZE",
            "MASTER_ADDR",
            "MASTER_PORT",
            "WG_BACKEND",
            "CUDA_VISIBLE_DEVICES",
        )
        return {k: os.environ.get(k) for k in keys} | {"backend": dist.get_backend(), "pid": os.getpid()}

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def scale_and_sum(self, data: DataProto) -> DataProto:
        y = data.batch["x"] * self.scale
        total = y.sum()
        dist.all_reduce(total)
        out = DataProto.from_dict(
            {"y": y, "total": total.expand(len(data)).clone()},
            {"who": np.array([self.rank] * len(data), dtype=object)},
            meta_info={"metrics": {"rank": self.rank}},
        )
        return out

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def scale_async(self, data: DataProto) -> DataProto:
        return DataProto.from_dict({"y": data.batch["x"] * self.scale})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_METRIC)
    def row_count(self, data: DataProto) -> int:
        return len(data)

    @register(dispatch_mode=Dispatch.DP_COMPUTE)
    def add(self, value: int) -> int:
        return value + self.rank

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def echo(self, value):
        return (self.rank, value)

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def rank_zero_only(self, values: list) -> tuple:
        return self.rank, values

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("pairs"))
    def tag_pairs(self, data: DataProto) -> DataProto:
        return DataProto.from_dict({"x": data.batch["x"], "rank": torch.full((len(data),), self.rank)})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def gather_all(self, data: DataProto) -> DataProto:
        all_gather_data_proto(data)
        return DataProto.from_dict({"n": torch.tensor([len(data)])}, {"uids": [list(data.non_tensor_batch["uid"])]})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def die_on(self, rank: int) -> int:
        dist.barrier()
        if self.rank == rank:
            os.kill(os.getpid(), signal.SIGKILL)
        dist.barrier()  # the surviving ranks block here on the dead one
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def die_after_an_echo(self, rank: int) -> int:
        """Rank ``rank`` dies a moment after the others fail as a collective fails when a peer is gone."""
        if self.rank != rank:
            raise RuntimeError("Read error: Connection reset by peer")  # gloo's words when a peer's process ends
        time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGKILL)
        return self.rank


class DoubleWorker(Worker):
    """A second role, to fuse with ``ScaleWorker``-free roles in one process."""

    def __init__(self, offset: float) -> None:
        super().__init__()
        self.offset = offset

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def shift(self, data: DataProto) -> DataProto:
        return DataProto.from_dict({"y": data.batch["y"] + self.offset, "pid": torch.full((len(data),), os.getpid())})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def pid(self) -> int:
        return os.getpid()


class CountWorker(Worker):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def bump(self) -> int:
        self.calls += 1
        return self.calls

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def pid(self) -> int:
        return os.getpid()

    @register(dispatch_mode=Dispatch.RANK_ZERO, execute_mode=Execute.RANK_ZERO)
    async def async_rank(self) -> int:
        return self.rank


def make_group(cls, world: int, *args, **kwargs):
    pool = RayResourcePool([world], use_gpu=False, max_colocate_count=kwargs.pop("colocate", 1))
    return RayWorkerGroup(pool, RayClassWithInitArgs(ray.remote(cls), *args), **kwargs), pool


@pytest.fixture(scope="module")
def scale_group(ray_cluster):
    group, pool = make_group(ScaleWorker, 2, 3.0, name_prefix="scale")
    yield group
    group.shutdown()
    pool.release()


def x_batch(n: int, **kwargs) -> DataProto:
    return DataProto.from_dict({"x": torch.arange(float(n))}, {"uid": [f"u{i}" for i in range(n)]}, **kwargs)


def test_workers_get_rendezvous_env_and_gloo(scale_group):
    envs = scale_group.env()
    assert [e["RANK"] for e in envs] == ["0", "1"]
    assert {e["WORLD_SIZE"] for e in envs} == {"2"} and [e["LOCAL_RANK"] for e in envs] == ["0", "1"]
    assert len({(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs}) == 1
    assert {e["backend"] for e in envs} == {"gloo"} and {e["WG_BACKEND"] for e in envs} == {"ray"}
    assert envs[0]["pid"] != envs[1]["pid"]
    # workers on CPU bundles see no GPU, even on a node that has some (trainer.device=cpu on a GPU cluster)
    assert {e["CUDA_VISIBLE_DEVICES"] for e in envs} == {""}


def test_dp_compute_proto_chunks_allreduces_and_concats(scale_group):
    out = scale_group.scale_and_sum(x_batch(6))
    assert out.batch["y"].tolist() == [0.0, 3.0, 6.0, 9.0, 12.0, 15.0]
    assert out.batch["total"].tolist() == [45.0] * 6  # all-reduce over both ranks' halves
    assert list(out.non_tensor_batch["who"]) == [0, 0, 0, 1, 1, 1]
    assert out.meta_info["metrics"] == {"rank": [0, 1]}


def test_uneven_batch_is_error_without_padding_and_padded_with_it(scale_group):
    with pytest.raises(ValueError, match=r"5 rows does not divide among the 2 .*'scale'"):
        scale_group.scale_and_sum(x_batch(5))
    out = scale_group.scale_and_sum(x_batch(5, auto_padding=True))
    assert out.batch["y"].tolist() == [0.0, 3.0, 6.0, 9.0, 12.0]  # padded row stripped
    assert list(out.non_tensor_batch["who"]) == [0, 0, 0, 1, 1]
    assert out.batch["total"][0].item() == 3.0 * (0 + 1 + 2 + 3 + 4 + 4)  # the pad row (a copy) was computed on


def test_other_dispatch_modes(scale_group):
    assert scale_group.row_count(x_batch(4)) == [2, 2]
    assert scale_group.add([10, 20]) == [10, 21]
    with pytest.raises(ValueError, match="list of 2 entries"):
        scale_group.add(5)
    assert scale_group.echo("same") == [(0, "same"), (1, "same")]
    assert scale_group.echo(["a", "b"]) == [(0, "a"), (1, "b")]  # per-rank lists are split, as in veRL
    assert scale_group.rank_zero_only([1, 2]) == (0, [1, 2])  # arguments unchanged, output unwrapped

    def double_rows(worker, data):
        return DataProto.from_dict({"x2": data.batch["x"] * 2, "r": torch.full((len(data),), worker.rank)})

    out = scale_group.execute_with_func_generator(double_rows, x_batch(4))
    assert out.batch["x2"].tolist() == [0.0, 2.0, 4.0, 6.0] and out.batch["r"].tolist() == [0, 0, 1, 1]
    assert scale_group.execute_func_rank_zero(max, 3, 7) == 7
    assert scale_group.execute_all_sync("echo", 1) == [(0, 1), (1, 1)]
    assert scale_group.execute_rank_zero_sync("echo", 2) == (0, 2)


def test_nd_dispatch_collects_only_marked_ranks(scale_group):
    # 2 ranks in one "pair": dp size 1, both get the full batch, only rank 0 is collected.
    out = scale_group.tag_pairs(x_batch(4))
    assert out.batch["rank"].tolist() == [0, 0, 0, 0] and out.batch["x"].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert scale_group._dispatch_info["pairs"] == ([0, 0], [True, False])


def test_all_gather_data_proto_inside_workers(scale_group):
    out = scale_group.gather_all(x_batch(4))
    assert out.batch["n"].tolist() == [4, 4]
    assert list(out.non_tensor_batch["uids"]) == [["u0", "u1", "u2", "u3"]] * 2


def test_non_blocking_future_feeds_another_group(scale_group, ray_cluster):
    shifter, pool = make_group(DoubleWorker, 2, 100.0, name_prefix="shift")
    try:
        future = scale_group.scale_async(x_batch(4))
        assert isinstance(future, DataProtoFuture)
        # the second group materializes the first group's output on its workers, not on the driver
        out = shifter.shift(future)
        assert out.batch["y"].tolist() == [100.0, 103.0, 106.0, 109.0]
        assert set(out.batch["pid"].tolist()) == set(shifter.pid())
        halves = scale_group.scale_async(x_batch(4)).chunk(2)  # lazy: split only when fetched
        assert [h.get().batch["y"].tolist() for h in halves] == [[0.0, 3.0], [6.0, 9.0]]
        padded = scale_group.scale_async(x_batch(3, auto_padding=True)).get()
        assert padded.batch["y"].tolist() == [0.0, 3.0, 6.0]
    finally:
        shifter.shutdown()
        pool.release()


def test_fused_colocated_roles_share_one_process(ray_cluster):
    fused_cls = create_colocated_worker_cls(
        {
            "shift": RayClassWithInitArgs(ray.remote(DoubleWorker), 1.0),
            "count": RayClassWithInitArgs(CountWorker),
        }
    )
    pool = RayResourcePool([2], use_gpu=False, max_colocate_count=1)
    group = RayWorkerGroup(pool, fused_cls, name_prefix="fused")
    try:
        roles = group.spawn({"shift", "count"})
        assert roles["count"].bump() == [1, 1]
        assert roles["count"].bump() == [2, 2]  # state persists in the role's object
        out = roles["shift"].shift(DataProto.from_dict({"y": torch.zeros(4)}))
        assert out.batch["y"].tolist() == [1.0] * 4
        assert roles["shift"].pid() == roles["count"].pid()  # one process per rank holds both roles
        assert roles["count"].async_rank() == 0
        group.fuse({"count"})
        assert group.count.bump() == [3, 3]
        with pytest.raises(ValueError, match="no methods of role 'nope'"):
            group.spawn({"nope"})
    finally:
        group.shutdown()
        pool.release()


def test_cpu_accounting_of_colocated_groups(ray_cluster):
    pool = RayResourcePool([2], use_gpu=False, max_colocate_count=2)
    first = RayWorkerGroup(pool, RayClassWithInitArgs(CountWorker), name_prefix="colo_a")
    second = RayWorkerGroup(pool, RayClassWithInitArgs(CountWorker), name_prefix="colo_b")
    try:
        assert first.bump() == [1, 1] and second.bump() == [1, 1]
        assert set(first.pid()).isdisjoint(second.pid())  # two groups, four processes, two bundles
        assert pool.bundle() == {"CPU": 1}
    finally:
        first.shutdown()
        second.shutdown()
        pool.release()


def test_unsatisfiable_pool_fails_fast_naming_the_shortfall(ray_cluster):
    pool = RayResourcePool([64], use_gpu=False, placement_group_timeout_s=2)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"could not get 64 bundles of \{'CPU': 1\}"):
        RayWorkerGroup(pool, RayClassWithInitArgs(CountWorker))
    # measured 2.3 s on 2 busy cores; the bound tells the pool's 2 s from the 60 s default
    assert time.monotonic() - start < 30


def test_killed_worker_is_an_error_naming_group_rank_and_method(ray_cluster):
    # rank 0 is left blocked in a gloo barrier until the 900 s gloo timeout: the driver must not wait for it
    group, pool = make_group(ScaleWorker, 2, 1.0, 900, name_prefix="doomed")
    try:
        start = time.monotonic()
        where = r"on node \S+ \(id [0-9a-f]{12}\)"
        with pytest.raises(WorkerDiedError, match=rf"'doomed': rank 1 .*{where}\) died while running 'die_on'") as e:
            group.die_on(1)
        # measured 7-17 s on 2 shared cores; a driver that waited for rank 0 would take the 900 s gloo timeout
        assert time.monotonic() - start < 200  # under the 300 s per-test timeout (pyproject), which ends a hang
        # the run's report: every worker asked whether it is alive, the dead one named by role, rank and node
        with pytest.raises(WorkerDiedError, match=rf"died: role scale rank 1 {where}\. The run stops") as report:
            raise_if_workers_died({"scale": group, "absent": None}, e.value)
        assert report.value.__cause__ is e.value
        assert "rank 0" not in str(report.value).split("(First seen")[0]  # the living rank is not reported
    finally:
        group.shutdown()
        pool.release()


def test_a_peers_error_before_a_death_is_reported_as_the_death(ray_cluster):
    group, pool = make_group(ScaleWorker, 2, 1.0, name_prefix="echo")
    try:
        # rank 1's error reaches the driver first; the group waits for rank 0 and names its death, chained to it
        with pytest.raises(WorkerDiedError, match=r"'echo': rank 0 .*died while running 'die_after_an_echo'") as e:
            group.die_after_an_echo(0)
        assert "Connection reset by peer" in str(e.value) and e.value.__cause__ is not None
    finally:
        group.shutdown()
        pool.release()


def test_placement_names_each_workers_node_and_pid_and_pools_ask_for_custom_resources(scale_group):
    lines = placement({"scale": scale_group})
    pids = sorted(info["pid"] for info in scale_group.env())
    assert len(lines) == scale_group.world_size
    assert sorted(int(line.rsplit("pid ", 1)[1]) for line in lines) == pids
    assert lines[0].startswith("role scale rank 0: node ") and len(set(scale_group.worker_nodes)) == 1
    # a raise with nobody dead leaves the caller's error as it is
    raise_if_workers_died({"scale": scale_group}, RuntimeError("not a death"))
    pool = RayResourcePool([2], use_gpu=False, custom_resources={"train_pool": 1})
    assert pool.bundle() == {"CPU": 1, "train_pool": 1.0}  # places the pool on nodes started with that resource


def test_method_exception_names_rank_and_method(scale_group):
    with pytest.raises(Exception, match="ZeroDivisionError|division by zero") as info:
        scale_group.execute_func_rank_zero(lambda: 1 / 0)
    assert "rank 0" in "".join(getattr(info.value, "__notes__", [])) + str(info.value)
