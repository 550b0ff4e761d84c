"""The training stack below the driver works without Ray: a fresh interpreter in which ``import ray`` fails imports
the FSDP engine, the actor, the critic, the hf rollout engine, the checkpoint engine, the algorithms and the protocol,
and runs one real PPO step on a tiny Qwen2 (generate → log-probs → GRPO advantages → ``update_policy`` → weight sync
into the rollout) on a world-size-1 gloo group.

The child is this very file run as a script: it installs the Ray blocker before anything else is imported (only the
standard library is imported at module level here), writes what it observed to a JSON file, and the test checks it.
"""

from __future__ import annotations

import importlib.abc
import json
import math
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]

# The packages imported with Ray blocked (each must import without it).
MODULES = (
    "verl.workers.engine",
    "verl.workers.actor",
    "verl.workers.critic",
    "verl.workers.rollout.hf_rollout",
    "verl.checkpoint_engine",
    "verl.algorithms",
    "verl.algorithms.core_algos",
    "verl.protocol",
)


class BlockRay(importlib.abc.MetaPathFinder):
    """A meta-path finder that makes ``ray`` and every ``ray.*`` module unimportable."""

    def find_spec(self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None) -> None:
        if fullname == "ray" or fullname.startswith("ray."):
            raise ImportError(f"{fullname} is blocked: this process must run without Ray")
        return None


def _child(out_dir: Path) -> dict:
    """Import the stack with Ray blocked and run one training step; returns the facts the test checks."""
    import importlib

    facts: dict = {"ray_preloaded": "ray" in sys.modules}
    try:
        import ray  # noqa: F401
    except ImportError:
        facts["ray_blocked"] = True
    else:
        facts["ray_blocked"] = False
    for name in MODULES:
        importlib.import_module(name)

    import numpy as np
    import torch
    import torch.distributed as dist

    from verl.algorithms import get_adv_estimator_fn
    from verl.checkpoint_engine import get_checkpoint_engine
    from verl.protocol import DataProto
    from verl.utils.tiny_model import save_tiny_qwen2
    from verl.workers.actor import DataParallelPPOActor
    from verl.workers.config.rollout import RolloutConfig
    from verl.workers.engine import FSDPEngine
    from verl.workers.rollout.hf_rollout import HFRollout

    torch.manual_seed(0)
    dist.init_process_group("gloo", init_method=f"file://{out_dir / 'pg'}", rank=0, world_size=1)
    try:
        model_dir = save_tiny_qwen2(out_dir / "model", seed=0)
        engine = FSDPEngine(model_dir, {"model_dtype": "float32", "dtype": "float32"}, {"lr": 1e-2})
        rollout = HFRollout(RolloutConfig(dtype="float32", response_length=6, prompt_length=6, n=2), model_dir)
        actor_config = {
            "ppo_mini_batch_size": 4,
            "ppo_micro_batch_size_per_gpu": 2,
            "clip_ratio": 0.2,
            "loss_agg_mode": "token-mean",
            "policy_loss": {"loss_mode": "vanilla"},
            "entropy_coeff": 0.0,
            "use_kl_loss": False,
            "grad_clip": 1.0,
        }
        actor = DataParallelPPOActor(actor_config, engine.module, engine.optimizer)

        def prompts(step: int) -> DataProto:
            ids = torch.tensor([[0, 0, 5, 17, 42, 9], [11, 23, 7, 64, 3, 88]])
            mask = (ids != 0).long()
            pos = (mask.cumsum(-1) - 1).clamp(min=0)
            uid = np.array(["p0", "p1"], dtype=object)
            batch = {"input_ids": ids, "attention_mask": mask, "position_ids": pos}
            return DataProto.from_dict(batch, {"uid": uid}, meta_info={"global_steps": step, "n": 2})

        # generate (2 prompts × n=2), then the trainer's log-probs of the same tokens
        batch = rollout.generate_sequences(prompts(0))
        old_log_probs, _ = actor.compute_log_prob(batch)
        response_mask = batch.batch["response_mask"].float()
        facts["samples"] = len(batch)
        facts["logprob_gap_before"] = float(
            ((old_log_probs - batch.batch["rollout_log_probs"]) * response_mask).abs().max()
        )

        # a rule reward (share of even token ids in the response), GRPO advantages from the registry
        responses = batch.batch["responses"]
        score = ((responses % 2 == 0).float() * response_mask).sum(-1) / response_mask.sum(-1).clamp(min=1)
        token_rewards = torch.zeros_like(response_mask)
        last = (response_mask.sum(-1).long() - 1).clamp(min=0)
        token_rewards[torch.arange(len(batch)), last] = score
        advantages, _ = get_adv_estimator_fn("grpo")(
            token_level_rewards=token_rewards, response_mask=response_mask, index=batch.non_tensor_batch["uid"]
        )
        facts["nonzero_advantages"] = int((advantages.abs() > 0).sum())
        batch.batch["old_log_probs"] = old_log_probs
        batch.batch["advantages"] = advantages

        # one policy update
        # (clone: on one rank the full tensors can be the parameters themselves, which the step updates in place)
        before = {name: tensor.clone() for name, tensor in engine.get_full_state_dict().items()}
        metrics = actor.update_policy(batch)
        after = engine.get_full_state_dict()
        facts["metrics"] = {key: [float(v) for v in values] for key, values in metrics.items()}
        facts["max_weight_change"] = max(float((after[k] - before[k]).abs().max()) for k in before)
        rollout_before_sync = dict(rollout.named_weights())
        facts["rollout_stale_before_sync"] = any(not torch.equal(rollout_before_sync[k], after[k]) for k in after)

        # weight sync trainer → rollout, verified by digest, then compared tensor by tensor here
        sync = get_checkpoint_engine({"backend": "naive", "update_weights_bucket_megabytes": 0.25}).send_weights(
            engine.iter_full_state_dict(), rollout, verify=True
        )
        facts["sync"] = sync
        synced = dict(rollout.named_weights())
        facts["rollout_differs_after_sync"] = sorted(k for k in after if not torch.equal(synced[k], after[k]))
        facts["trainer_tensors"] = len(after)

        # the synced rollout samples from the updated policy: its log-probs are the trainer's
        batch = rollout.generate_sequences(prompts(1))
        new_log_probs, _ = actor.compute_log_prob(batch)
        mask = batch.batch["response_mask"].float()
        facts["logprob_gap_after"] = float(((new_log_probs - batch.batch["rollout_log_probs"]) * mask).abs().max())
    finally:
        dist.destroy_process_group()
    facts["ray_modules"] = sorted(m for m in sys.modules if m == "ray" or m.startswith("ray."))
    return facts


def test_one_training_step_without_ray(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.update({"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "CUDA_VISIBLE_DEVICES": ""})
    result = subprocess.run(
        [sys.executable, __file__, str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-8000:]
    facts = json.loads((tmp_path / "facts.json").read_text())

    assert not facts["ray_preloaded"] and facts["ray_blocked"] and facts["ray_modules"] == []
    assert facts["samples"] == 4
    # the rollout's log-probs and the trainer's agree (same float32 weights), before and after the update
    assert facts["logprob_gap_before"] < 1e-4 and facts["logprob_gap_after"] < 1e-4
    assert facts["nonzero_advantages"] > 0
    metrics = facts["metrics"]
    for key in ("actor/pg_loss", "actor/grad_norm", "actor/pg_clipfrac"):
        assert metrics[key] and all(math.isfinite(v) for v in metrics[key]), key
    assert metrics["actor/grad_norm"][0] > 0
    assert facts["max_weight_change"] > 1e-4  # the update moved the weights (AdamW, lr 1e-2: about lr per weight)
    assert facts["rollout_stale_before_sync"]
    assert facts["sync"]["tensors"] == facts["trainer_tensors"] and facts["sync"]["buckets"] > 1
    assert facts["rollout_differs_after_sync"] == []


if __name__ == "__main__":
    sys.meta_path.insert(0, BlockRay())
    out = Path(sys.argv[1])
    (out / "facts.json").write_text(json.dumps(_child(out), indent=1))
