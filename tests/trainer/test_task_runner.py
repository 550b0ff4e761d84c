"""veRL's ``TaskRunner`` helpers, as a recipe's own runner calls them (the whole recipe runs in
test_recipe_carry_over.py)."""

from __future__ import annotations

import pytest

from verl.trainer.config.layout import resolve_layout
from verl.trainer.config.validate import merged
from verl.trainer.main_ppo import TaskRunner
from verl.trainer.ppo.utils import Role, check_ref_worker, need_reference_policy
from verl.workers.fsdp_workers import ActorRolloutRefWorker, CriticWorker


def actor_class(remote_cls):
    return remote_cls.__ray_actor_class__


def test_helpers_fill_the_mappings():
    # an earlier script's reward_model.enable, read into reward.reward_model.enable as run_ppo does
    config = resolve_layout(merged(["actor_rollout_ref.actor.use_kl_loss=true", "reward_model.enable=true"]))
    runner = TaskRunner()
    actor_cls, group_cls = runner.add_actor_rollout_worker(config)
    runner.add_critic_worker(config)
    runner.add_reward_model_worker(config)
    runner.add_ref_policy_worker(config, actor_cls)
    assert actor_cls is ActorRolloutRefWorker and group_cls.__name__ == "RayWorkerGroup"
    classes = {role: actor_class(cls) for role, cls in runner.role_worker_mapping.items()}
    assert classes == {
        Role.ActorRollout: ActorRolloutRefWorker,
        Role.Critic: CriticWorker,
        Role.RefPolicy: ActorRolloutRefWorker,
    }  # the reward model is served: the trainer starts its replicas (verl.experimental.reward_loop)
    assert set(runner.mapping.values()) == {"global_pool"} and Role.RewardModel in runner.mapping
    check_ref_worker(runner.role_worker_mapping, Role.ActorRollout)  # the ref runs in the actor's class: fine
    assert need_reference_policy(runner.role_worker_mapping) and need_reference_policy(config)  # both of veRL's calls


def test_no_ref_without_a_kl_term_and_no_rm_unless_enabled():
    runner = TaskRunner()
    runner.add_actor_rollout_worker(merged())
    runner.add_reward_model_worker(merged())
    runner.add_ref_policy_worker(merged(), ActorRolloutRefWorker)
    assert set(runner.role_worker_mapping) == {Role.ActorRollout}
    assert not need_reference_policy(runner.role_worker_mapping)


def test_resource_pools():
    config = merged(
        [
            "trainer.n_gpus_per_node=2",
            "trainer.nnodes=2",
            "reward.reward_model.enable=true",
            "reward.reward_model.enable_resource_pool=true",
            "reward.reward_model.n_gpus_per_node=1",
            "reward.reward_model.nnodes=1",
        ]
    )
    runner = TaskRunner()
    runner.add_reward_model_worker(config)
    manager = runner.init_resource_pool_mgr(config)
    assert manager.resource_pool_spec == {"global_pool": [2, 2], "reward_pool": [1]}
    assert manager.mapping == {Role.RewardModel: "reward_pool"} and manager.get_n_gpus() == 5
    config.reward.reward_model.n_gpus_per_node = 0
    with pytest.raises(ValueError, match="reward.reward_model.n_gpus_per_node"):
        runner.init_resource_pool_mgr(config)


def test_a_separate_reference_worker_class_is_refused_by_name():
    class OtherRef(CriticWorker):
        pass

    mapping = {Role.ActorRollout: ActorRolloutRefWorker, Role.RefPolicy: OtherRef}
    with pytest.raises(TypeError, match="Role.RefPolicy.*OtherRef.*inside the actor"):
        check_ref_worker(mapping, Role.ActorRollout)
