"""When the old-log-prob pass is skipped (its log-probs taken from the update's forward), and why not otherwise.

The bit-for-bit equality itself is tested on the actor (tests/workers/actor/test_dp_actor.py) and end to end
(tests/trainer/test_main_ppo.py: the demo's metrics with the pass and without)."""

from __future__ import annotations

import pytest
import torch

from verl.trainer.config.validate import merged
from verl.trainer.ppo.on_policy import old_log_prob_in_update
from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.utils.tiny_model import build_tiny_qwen2
from verl.utils.torch_functional import has_active_dropout

# one update per step: 8 prompts × 2 samples, one mini-batch, the pass cut as the update (one worker)
ON_POLICY = [
    "algorithm.adv_estimator=grpo",
    "data.train_batch_size=8",
    "actor_rollout_ref.rollout.n=2",
    "actor_rollout_ref.actor.ppo_mini_batch_size=8",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
    "trainer.n_gpus_per_node=1",
]


def trainer(overrides: list[str], cls: type = RayPPOTrainer, bypass: bool = False, correction: bool = False):
    """A trainer object holding only what the decision reads (no workers)."""
    obj = cls.__new__(cls)
    obj.config, obj.bypass_mode, obj.rollout_correction = merged(ON_POLICY + overrides), bypass, correction
    return obj


def test_on_policy_grpo_skips_the_pass():
    assert old_log_prob_in_update(trainer([])) == (True, "")
    # the update cuts the whole batch in one micro-batch when neither size is set: the same cut
    unset = ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=null"]
    assert old_log_prob_in_update(
        trainer([*unset, "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=null"])
    )[0]
    assert old_log_prob_in_update(trainer(["actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=null"]))[0]


class OwnPass(RayPPOTrainer):
    def _compute_old_log_prob(self, batch):  # a recipe's own pass must run
        return super()._compute_old_log_prob(batch)


@pytest.mark.parametrize(
    ("overrides", "kwargs", "reason"),
    [
        (["actor_rollout_ref.actor.skip_on_policy_old_log_prob=false"], {}, "skip_on_policy_old_log_prob=false"),
        ([], {"bypass": True}, "bypass mode"),
        ([], {"cls": OwnPass}, "OwnPass overrides _compute_old_log_prob"),
        (["actor_rollout_ref.actor.ppo_epochs=2"], {}, "more than one PPO epoch or mini-batch"),
        (["actor_rollout_ref.actor.ppo_mini_batch_size=4"], {}, "more than one PPO epoch or mini-batch"),
        (["actor_rollout_ref.actor.shuffle=true"], {}, "shuffle"),
        (["actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4"], {}, "micro-batches differ"),
        (["actor_rollout_ref.actor.use_dynamic_bsz=true"], {}, "micro-batches differ"),
        ([], {"correction": True}, "rollout correction"),
        (["algorithm.use_kl_in_reward=true"], {}, "the KL in the reward"),
        (["actor_rollout_ref.actor.calculate_sum_pi_squared=true"], {}, "Σπ²"),
    ],
)
def test_the_pass_stays_when_the_update_would_not_reproduce_it(overrides, kwargs, reason):
    on, why = old_log_prob_in_update(trainer(overrides, **kwargs))
    assert not on and reason in why


def test_dropout_is_seen_in_layers_and_in_the_hf_config():
    model = build_tiny_qwen2(seed=0)
    assert not has_active_dropout(model)
    model.config.attention_dropout = 0.1  # Qwen2 applies it functionally in train mode
    assert has_active_dropout(model)
    model.config.attention_dropout = 0.0
    model.model.layers[0].mlp.act_fn = torch.nn.Dropout(0.2)
    assert has_active_dropout(model)
