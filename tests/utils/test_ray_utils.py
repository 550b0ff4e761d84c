"""Logical-CPU accounting for Ray start-up."""

from __future__ import annotations

import os

import pytest

from verl.utils.ray_utils import init_ray_for_workers, required_logical_cpus


def test_required_logical_cpus_covers_every_worker_bundle():
    cores = os.cpu_count() or 1
    assert required_logical_cpus(0) == max(cores, 1)
    assert required_logical_cpus(cores + 5) == cores + 6  # one bundle per worker + one spare
    assert required_logical_cpus(cores + 5, reserve=0) == cores + 5
    with pytest.raises(ValueError, match="non-negative"):
        required_logical_cpus(-1)


def test_init_ray_for_workers_reuses_a_running_cluster(ray_cluster, caplog):
    before = ray_cluster.cluster_resources()["CPU"]
    init_ray_for_workers(2)  # already running: nothing restarts
    assert ray_cluster.cluster_resources()["CPU"] == before
    with caplog.at_level("WARNING"):
        init_ray_for_workers(int(before) + 1)
    assert "need one each" in caplog.text
