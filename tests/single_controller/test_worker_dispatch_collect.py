"""A fused worker taking over another worker's dispatch / collect info (`Worker.set_dispatch_collect`)."""

from __future__ import annotations

import pytest

from verl.single_controller.base import Worker


def test_set_dispatch_collect_copies_another_workers_mesh_under_a_new_name(monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "localhost")
    monkeypatch.setenv("MASTER_PORT", "1")
    ref, fused = Worker(), Worker()
    ref._register_dispatch_collect_info("ref", dp_rank=3, is_collect=False)
    assert ref.get_dispatch_collect() == {"dispatch_dp_rank": {"ref": 3}, "collect_dp_rank": {"ref": False}}
    fused.set_dispatch_collect("ref_of_fused", **ref.get_dispatch_collect())
    assert fused._query_dispatch_info("ref_of_fused") == 3 and fused._query_collect_info("ref_of_fused") is False
    with pytest.raises(AssertionError, match="already registered"):
        fused.set_dispatch_collect("ref_of_fused", **ref.get_dispatch_collect())
    with pytest.raises(ValueError, match="one dp rank"):
        fused.set_dispatch_collect("other", dispatch_dp_rank={"a": 0, "b": 1}, collect_dp_rank={"a": True, "b": True})
