"""Worker groups on real Ray actors: TensorDict arguments (jagged nested tensors, per-row objects, shared values)
split over the ranks like DataProtos, joined back in rank order; extra environment variables for the workers."""

from __future__ import annotations

import os
import sys

import pytest
import ray
import torch
from tensordict import TensorDict

from verl.protocol import DataProtoConfig, DataProtoFuture
from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, make_nd_compute_dataproto_dispatch_fn, register
from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
from verl.utils import tensordict_utils as tu

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


class TdWorker(Worker):
    """Records what each rank received and tags rows with the rank."""

    def __init__(self) -> None:
        super().__init__()
        self._register_dispatch_collect_info("train", dp_rank=self.rank, is_collect=True)

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="train"), blocking=False)
    def tag(self, data: TensorDict) -> TensorDict:
        data = tu.contiguous(data)
        lengths = [len(r) for r in data["ids"].unbind(0)]
        data["rank"] = torch.full((len(data),), self.rank)
        data["lengths"] = torch.tensor(lengths)
        return data

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def double(self, data: TensorDict) -> TensorDict:
        return tu.get_tensordict({"x": data["x"] * 2, "rank": torch.full((len(data),), self.rank)})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def getenv(self, key: str) -> str | None:
        return os.environ.get(key)


@pytest.fixture(scope="module")
def td_group(ray_cluster):
    pool = RayResourcePool([2], use_gpu=False, max_colocate_count=1)
    group = RayWorkerGroup(
        pool, RayClassWithInitArgs(ray.remote(TdWorker)), name_prefix="td_dispatch", worker_env={"MY_FLAG": "on"}
    )
    yield group
    group.shutdown()
    pool.release()


def test_nested_tensordict_is_split_by_dp_rank_and_joined_in_order(td_group):
    ids = torch.nested.as_nested_tensor([torch.arange(n) for n in (3, 4, 5, 6)], layout=torch.jagged)
    data = tu.get_tensordict({"ids": ids, "x": torch.arange(4.0), "tag": list("abcd")}, {"temperature": 0.7})
    future = td_group.tag(data)
    assert isinstance(future, DataProtoFuture)
    out = future.get()
    assert isinstance(out, TensorDict) and len(out) == 4
    assert out["rank"].tolist() == [0, 0, 1, 1]
    assert out["lengths"].tolist() == [3, 4, 5, 6]
    assert [r.tolist() for r in out["ids"].unbind(0)] == [list(range(n)) for n in (3, 4, 5, 6)]
    assert tu.get(out, "tag") == list("abcd") and tu.get(out, "temperature") == 0.7


def test_blocking_tensordict_call_and_its_refusals(td_group):
    out = td_group.double(tu.get_tensordict({"x": torch.arange(4.0)}))
    assert out["x"].tolist() == [0.0, 2.0, 4.0, 6.0] and out["rank"].tolist() == [0, 0, 1, 1]
    with pytest.raises(ValueError, match="3 rows does not divide among the 2"):
        td_group.double(tu.get_tensordict({"x": torch.arange(3.0)}))


def test_uneven_tensordict_is_padded_and_unpadded_when_auto_padding_is_on(td_group):
    DataProtoConfig.auto_padding = True
    try:
        out = td_group.double(tu.get_tensordict({"x": torch.arange(3.0)}))
    finally:
        DataProtoConfig.auto_padding = False
    assert out["x"].tolist() == [0.0, 2.0, 4.0] and out["rank"].tolist() == [0, 0, 1]


def test_worker_env_reaches_every_rank_and_cannot_override_the_groups_own(td_group, ray_cluster):
    assert td_group.getenv("MY_FLAG") == ["on", "on"]
    pool = RayResourcePool([1], use_gpu=False, max_colocate_count=1)
    try:
        with pytest.raises(ValueError, match=r"\['RANK', 'WORLD_SIZE'\]"):
            RayWorkerGroup(
                pool,
                RayClassWithInitArgs(ray.remote(TdWorker)),
                name_prefix="td_env_clash",
                worker_env={"WORLD_SIZE": "100", "RANK": "3", "OK": "1"},
            )
    finally:
        pool.release()
