"""The workers' NVTX override under the torch profiler (`verl.trainer.constants_ppo`)."""

from __future__ import annotations

from omegaconf import OmegaConf

from verl.trainer.constants_ppo import (
    NVTX_INJECTION_DISABLED,
    NVTX_INJECTION_ENV,
    get_ppo_ray_runtime_env,
    ppo_worker_env,
)


def test_torch_profiler_overrides_an_inherited_nvtx_injection_unless_kept(monkeypatch):
    torch_cfg = OmegaConf.create({"global_profiler": {"tool": "torch"}})
    monkeypatch.setenv(NVTX_INJECTION_ENV, "/cuda/libcupti.so")
    assert ppo_worker_env(torch_cfg)[NVTX_INJECTION_ENV] == NVTX_INJECTION_DISABLED
    assert get_ppo_ray_runtime_env(torch_cfg)["env_vars"][NVTX_INJECTION_ENV] == NVTX_INJECTION_DISABLED
    assert NVTX_INJECTION_ENV not in ppo_worker_env(OmegaConf.create({"global_profiler": {"tool": None}}))
    assert NVTX_INJECTION_ENV not in ppo_worker_env()
    monkeypatch.setenv("VERL_KEEP_NVTX_INJECTION", "1")
    assert NVTX_INJECTION_ENV not in get_ppo_ray_runtime_env(torch_cfg)["env_vars"]
