"""Remove-padding and dynamic batch sizes on 2 Ray workers × gloo × FSDP2 equal the padded single-process actor."""

from __future__ import annotations

import copy
import sys

import numpy as np
import pytest
import ray
import torch
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM

from verl.protocol import DataProto
from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
from verl.utils.seqlen_balancing import balance_batch
from verl.workers.actor import DataParallelPPOActor
from verl.workers.config import HFModelConfig
from verl.workers.config.builders import build_actor_config
from verl.workers.fsdp_workers import ActorRolloutRefWorker

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

PROMPTS, N, PROMPT_LEN, RESPONSE_LEN = 4, 2, 6, 8
LR, BUDGET = 0.5, 16
# (prompt, response) valid lengths: rank 0's rows need 4 micro-batches of ≤ 16 tokens, rank 1's fit in 1, so the
# ranks must agree on 4 (else FSDP's collectives would not line up)
LENGTHS = [(6, 8), (5, 8), (6, 7), (4, 8), (2, 1), (3, 2), (1, 1), (2, 3)]
# float32 over 2 ranks vs 1 process: summation order only. Measured ≤ 1e-6; tolerance 1e-5.
TOL = 1e-5


def packing_config(model_dir: str):
    return OmegaConf.create(
        {
            # actor.use_remove_padding is left null: it comes from the model
            "model": {"path": model_dir, "enable_gradient_checkpointing": False, "use_remove_padding": True},
            "actor": {
                "strategy": "fsdp2",
                "ppo_mini_batch_size": PROMPTS,
                "use_dynamic_bsz": True,
                "ppo_max_token_len_per_gpu": BUDGET,
                "optim": {"optimizer": "SGD", "lr": LR, "weight_decay": 0.0},
                "fsdp_config": {"dtype": "float32"},
                "entropy_coeff": 0.01,
                "use_kl_loss": False,
            },
            "rollout": {
                "name": "hf",
                "dtype": "float32",
                "n": N,
                "prompt_length": PROMPT_LEN,
                "response_length": RESPONSE_LEN,
                "log_prob_use_dynamic_bsz": True,
                "log_prob_max_token_len_per_gpu": BUDGET,
            },
            "ref": {
                "fsdp_config": {"dtype": "float32"},
                "log_prob_use_dynamic_bsz": True,
                "log_prob_max_token_len_per_gpu": BUDGET,
            },
        }
    )


def test_actor_use_remove_padding_defaults_to_the_models():
    model = HFModelConfig(path="unused", use_remove_padding=True)
    assert build_actor_config(OmegaConf.create({}), rollout_n=1, dp_size=1, model=model).use_remove_padding is True
    explicit = OmegaConf.create({"use_remove_padding": False})
    assert build_actor_config(explicit, rollout_n=1, dp_size=1, model=model).use_remove_padding is False
    assert build_actor_config(OmegaConf.create({}), rollout_n=1, dp_size=1).use_remove_padding is None


def ragged_batch() -> DataProto:
    g = torch.Generator().manual_seed(0)
    rows = len(LENGTHS)
    input_ids = torch.randint(3, 256, (rows, PROMPT_LEN + RESPONSE_LEN), generator=g)
    attention_mask = torch.zeros_like(input_ids)
    response_mask = torch.zeros(rows, RESPONSE_LEN, dtype=torch.long)
    for row, (p, r) in enumerate(LENGTHS):
        attention_mask[row, PROMPT_LEN - p : PROMPT_LEN + r] = 1
        response_mask[row, :r] = 1
    input_ids = input_ids * attention_mask
    return DataProto.from_dict(
        {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
            "responses": input_ids[:, PROMPT_LEN:],
            "response_mask": response_mask,
            "advantages": torch.randn(rows, RESPONSE_LEN, generator=g) * response_mask,
        },
        meta_info={"temperature": 1.0},
    )


@pytest.fixture(scope="module")
def packed_workers(ray_cluster, tiny_model_dir):
    pool = RayResourcePool([2], use_gpu=False, max_colocate_count=1)
    cls = RayClassWithInitArgs(
        ray.remote(ActorRolloutRefWorker), config=packing_config(tiny_model_dir), role="actor_rollout_ref"
    )
    wg = RayWorkerGroup(pool, cls, name_prefix="packing")
    wg.init_model()
    yield wg
    wg.shutdown()
    pool.release()


def padded_reference(model_dir: str) -> DataParallelPPOActor:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    rows = len(LENGTHS)
    cfg = {"ppo_mini_batch_size": rows, "ppo_micro_batch_size_per_gpu": rows, "entropy_coeff": 0.01}
    return DataParallelPPOActor(cfg, model, torch.optim.SGD(model.parameters(), lr=LR, weight_decay=0.0))


def assert_close_on(actual: torch.Tensor, expected: torch.Tensor, mask: torch.Tensor) -> float:
    diff = float(((actual - expected) * mask).abs().max())
    assert diff <= TOL, diff
    return diff


def test_packed_dynamic_log_probs_and_update_equal_the_padded_single_process_actor(packed_workers, tiny_model_dir):
    reference = padded_reference(tiny_model_dir)
    batch = ragged_batch()
    mask = batch.batch["response_mask"]
    expected, _ = reference.compute_log_prob(copy.deepcopy(batch))
    # unbalanced ranks (52 vs 15 tokens): the dynamic micro-batch counts are agreed, the rows come back in order
    old = packed_workers.compute_log_prob(batch).batch["old_log_probs"]
    assert_close_on(old, expected, mask)
    assert_close_on(packed_workers.compute_ref_log_prob(batch).batch["ref_log_prob"], expected, mask)

    # balance the ranks as the trainer does, then one PPO step on each side
    permutation, metrics = balance_batch(batch, dp_size=2)
    assert metrics["global_seqlen/minmax_diff"] == 37  # 52 | 15 before ...
    assert (metrics["global_seqlen/balanced_min"], metrics["global_seqlen/balanced_max"]) == (33, 34)  # ... the best
    batch.batch["old_log_probs"] = old[permutation]
    update_metrics = packed_workers.update_actor(batch).meta_info["metrics"]
    ref_metrics = reference.update_policy(copy.deepcopy(batch))
    assert np.mean(update_metrics["actor/pg_loss"]) == pytest.approx(ref_metrics["actor/pg_loss"][0], rel=1e-5)
    assert update_metrics["actor/grad_norm"][0] == pytest.approx(ref_metrics["actor/grad_norm"][0], rel=1e-5)

    after = packed_workers.compute_log_prob(batch).batch["old_log_probs"]
    expected_after, _ = reference.compute_log_prob(copy.deepcopy(batch))
    assert_close_on(after, expected_after, batch.batch["response_mask"])
    assert float(((after - old[permutation]) * batch.batch["response_mask"]).abs().max()) > 1e-3  # it moved
