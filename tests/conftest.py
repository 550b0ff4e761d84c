"""Shared test fixtures: one local Ray cluster per test session; `gpu` tests skip without CUDA."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# The Ray workers and CLI runs the suite starts (several at once on 2 cores) compute with one thread each, as Ray's
# default gives them; main_ppo would otherwise split the cores between a run's workers (this process, whose torch
# is already loaded, keeps its threads).
torch.get_num_threads()
os.environ.setdefault("OMP_NUM_THREADS", "1")

# Logical CPUs for the test cluster: bundles are {"CPU": 1} per worker, and several groups live at once.
RAY_TEST_NUM_CPUS = int(os.environ.get("VERL_TEST_RAY_CPUS", "8"))


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def ray_cluster():
    """A local Ray cluster, started once for the session and shut down at its end."""
    import ray

    if not ray.is_initialized():
        ray.init(
            num_cpus=RAY_TEST_NUM_CPUS,
            include_dashboard=False,
            log_to_driver=True,
            runtime_env={"env_vars": {"RAY_AUTH_MODE": "disabled", "TOKENIZERS_PARALLELISM": "false"}},
        )
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """A tiny Qwen2 saved as a HF folder (hidden 128, 4 heads, 2 layers, vocab 256; eos 1, pad 0)."""
    from verl.utils.tiny_model import save_tiny_qwen2

    return save_tiny_qwen2(tmp_path_factory.mktemp("models") / "tiny_qwen2", seed=0)
