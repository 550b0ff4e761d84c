"""@register, the dispatch registry and DynamicEnum, without Ray (dispatch functions are pure)."""

from __future__ import annotations

import pickle

import pytest
import torch

from verl.protocol import DataProto
from verl.single_controller.base import Worker, WorkerGroup
from verl.single_controller.base.decorator import (
    MAGIC_ATTR,
    PADDING_SIZE_KEY,
    Dispatch,
    Execute,
    get_predefined_dispatch_fn,
    register,
    register_dispatch_mode,
    update_dispatch_mode,
)


class FakeGroup:
    """Only what dispatch functions read: the world size (the Ray group is tested with real actors elsewhere)."""

    world_size = 3
    name_prefix = "fake"


def test_register_stores_settings_and_materializes_nothing_else():
    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, execute_mode=Execute.RANK_ZERO, blocking=False)
    def method(self, x):
        return x + 1

    assert getattr(method, MAGIC_ATTR) == {
        "dispatch_mode": Dispatch.DP_COMPUTE_PROTO,
        "execute_mode": Execute.RANK_ZERO,
        "blocking": False,
    }
    assert method(None, 1) == 2 and method.__name__ == "method"


def test_register_rejects_bad_modes():
    with pytest.raises(TypeError, match="dispatch_mode"):
        register(dispatch_mode="DP_COMPUTE_PROTO")
    with pytest.raises(TypeError, match="execute_mode"):
        register(execute_mode="ALL")
    with pytest.raises(ValueError, match="collect_fn"):
        register(dispatch_mode={"dispatch_fn": lambda *a: a})


def test_dp_compute_proto_chunks_and_broadcasts():
    fns = get_predefined_dispatch_fn(Dispatch.DP_COMPUTE_PROTO)
    data = DataProto.from_dict({"x": torch.arange(6)})
    args, kwargs = fns["dispatch_fn"](FakeGroup(), data, 7, flag=True)
    assert [p.batch["x"].tolist() for p in args[0]] == [[0, 1], [2, 3], [4, 5]]
    assert args[1] == [7, 7, 7] and kwargs == {"flag": [True, True, True]}
    padded = DataProto.from_dict({"x": torch.arange(4)}, auto_padding=True)
    args, kwargs = fns["dispatch_fn"](FakeGroup(), padded)
    assert kwargs[PADDING_SIZE_KEY] == 2 and [len(p) for p in args[0]] == [2, 2, 2]
    assert len(padded) == 4  # the caller's batch is not padded in place
    with pytest.raises(ValueError, match="different row counts"):
        fns["dispatch_fn"](FakeGroup(), data, DataProto.from_dict({"x": torch.arange(3)}))
    merged = fns["collect_fn"](FakeGroup(), args[0])
    assert merged.batch["x"].tolist() == [0, 1, 2, 3, 3, 3]


def test_one_to_all_and_dp_compute():
    args, kwargs = get_predefined_dispatch_fn(Dispatch.ONE_TO_ALL)["dispatch_fn"](FakeGroup(), "a", k=1)
    assert args == (["a"] * 3,) and kwargs == {"k": [1] * 3}
    fns = get_predefined_dispatch_fn(Dispatch.DP_COMPUTE)
    with pytest.raises(ValueError, match=r"argument 0 must be a list of 3 entries .* of length 2"):
        fns["dispatch_fn"](FakeGroup(), [1, 2])
    with pytest.raises(RuntimeError, match="expected 3 outputs"):
        fns["collect_fn"](FakeGroup(), [1])
    with pytest.raises(NotImplementedError, match="DIRECT_ROLLOUT_METHOD marks rollout-server methods"):
        get_predefined_dispatch_fn(Dispatch.DIRECT_ROLLOUT_METHOD)["dispatch_fn"](FakeGroup())


def test_register_dispatch_mode_adds_a_named_mode_and_workers_bind_it():
    def dispatch_reverse(wg, *args, **kwargs):
        return tuple(list(reversed(a)) for a in args), kwargs

    def collect_sum(wg, outputs):
        return sum(outputs)

    mode = register_dispatch_mode("TEST_REVERSE_SUM", dispatch_reverse, collect_sum)
    try:
        assert Dispatch.TEST_REVERSE_SUM is mode and Dispatch.get("TEST_REVERSE_SUM") is mode
        assert pickle.loads(pickle.dumps(mode)) is mode
        with pytest.raises(ValueError, match="already registered"):
            register_dispatch_mode("TEST_REVERSE_SUM", dispatch_reverse, collect_sum)

        class MyWorker(Worker):
            @register(dispatch_mode=Dispatch.TEST_REVERSE_SUM)
            def work(self, x):
                return x

        class ListGroup(WorkerGroup):
            """Executes in-process on plain objects: enough to check that binding wires the registry."""

            def __init__(self):
                super().__init__(name_prefix="local")
                self._workers = [object(), object()]
                self.calls = []
                self._bind_worker_method(MyWorker)

            def execute_all_async(self, method_name, *args, **kwargs):
                self.calls.append((method_name, args))
                return [a[i] for a in args for i in range(2)]

            def _wait(self, futures, method_name, ranks):
                return futures

        group = ListGroup()
        assert group.work([1, 10]) == 11 and group.calls == [("work", ([10, 1],))]
        update_dispatch_mode(mode, dispatch_reverse, lambda wg, out: max(out))
        assert ListGroup().work([1, 10]) == 10
    finally:
        Dispatch.remove("TEST_REVERSE_SUM")
    with pytest.raises(ValueError, match="unknown Dispatch"):
        Dispatch.get("TEST_REVERSE_SUM")


def test_registered_method_cannot_shadow_group_api():
    class Clash(Worker):
        @register()
        def execute_all_async(self):
            return None

    with pytest.raises(ValueError, match="clashes with WorkerGroup.execute_all_async"):
        WorkerGroup(name_prefix="g")._bind_worker_method(Clash)
