"""On-policy distillation's teachers served behind our request API (veRL 0.10's ``MultiTeacherModelManager`` and
``AsyncTeacherLLMServerManager``): two teachers of different weights on one teacher pool, each sample routed by its
``teacher_key`` field, and the log-probs each answers equal to its model's own forward pass over the sequence."""

from __future__ import annotations

import asyncio

import pytest
import torch
from omegaconf import OmegaConf

from verl.experimental.teacher_loop import AsyncTeacherLLMServerManager, MultiTeacherModelManager
from verl.single_controller.ray import RayResourcePool
from verl.trainer.config.compose import compose_config
from verl.utils.demo import ensure_demo_assets, save_demo_model
from verl.utils.hf_tokenizer import hf_tokenizer
from verl.workers.engine.hf_model import load_hf_model


@pytest.fixture(scope="module")
def teachers(tmp_path_factory):
    """The demo model as teacher ``gsm8k`` and a model of other weights (same tokenizer) as teacher ``apps``."""
    assets = ensure_demo_assets(tmp_path_factory.getbasetemp() / "verl_cache")
    other = tmp_path_factory.mktemp("other_teacher")
    save_demo_model(hf_tokenizer(assets.model_path), str(other))
    model = load_hf_model(str(other), value_model=False, dtype=torch.float32, seed=0)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5)  # other weights than the demo model's
    model.save_pretrained(str(other))
    config = compose_config("ppo_trainer")
    config.actor_rollout_ref.model.path = assets.model_path
    config.actor_rollout_ref.rollout.name = "hf"
    config.actor_rollout_ref.rollout.dtype = "float32"
    config.distillation = OmegaConf.merge(
        config.distillation,
        {
            "enabled": True,
            "n_gpus_per_node": 2,
            "nnodes": 1,
            "teacher_models": {
                "math": {"key": "gsm8k", "model_path": assets.model_path, "num_replicas": 1},
                "code": {"key": "apps", "model_path": str(other), "num_replicas": 1},
            },
        },
    )
    return config, {"gsm8k": assets.model_path, "apps": str(other)}, assets


def forward_log_probs(path: str, ids: list[int]) -> torch.Tensor:
    model = load_hf_model(path, value_model=False, dtype=torch.float32, seed=0)
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)


def test_each_sample_is_scored_by_its_teacher_at_every_position(ray_cluster, teachers):
    config, paths, _ = teachers
    pool = RayResourcePool([2], use_gpu=False, max_colocate_count=1, name_prefix="teacher_pool")
    manager = MultiTeacherModelManager(config, pool)
    try:
        assert sorted(manager.server_handles) == ["apps", "gsm8k"]
        ray_cluster.cloudpickle.loads(ray_cluster.cloudpickle.dumps(manager.get_client()))  # to agent-loop actors
        sequence = hf_tokenizer(paths["gsm8k"])("What is 3 + 4? 7", add_special_tokens=False)["input_ids"]
        for k, loss in ((0, "k3"), (3, "forward_kl_topk")):
            config.distillation.distillation_loss.loss_mode = loss
            config.distillation.distillation_loss.topk = 3
            client = AsyncTeacherLLMServerManager(config, manager.get_client())
            for key, path in paths.items():
                ids, log_probs = asyncio.run(client.compute_teacher_logprobs_single(sequence, routing_key=key))
                expected = forward_log_probs(path, sequence)[:-1]  # row i + 1 is about token i + 1
                assert ids.shape == log_probs.shape == (len(sequence), max(k, 1))
                if k == 0:
                    assert ids[:, 0].tolist() == sequence
                    want = expected.gather(-1, torch.tensor(sequence[1:])[:, None])
                else:
                    top = expected.topk(k, -1)
                    assert ids[1:].tolist() == top.indices.tolist()
                    want = top.values
                assert torch.allclose(log_probs[1:], want, atol=1e-5), (key, k)
        with pytest.raises(ValueError, match=r"value 'wiki' names no teacher; teachers: \['apps', 'gsm8k'\]"):
            asyncio.run(client.compute_teacher_logprobs_single(sequence, routing_key="wiki"))
        with pytest.raises(ValueError, match=r"teacher clients for \['gsm8k'\] but the teachers' keys are"):
            AsyncTeacherLLMServerManager(config, {"gsm8k": manager.get_client()["gsm8k"]})
    finally:
        manager.shutdown()
        pool.release()


def test_the_agent_loops_attach_each_training_samples_teacher_view_and_never_in_validation(ray_cluster, teachers):
    """veRL's flow: a sample finishes, its prompt + response go to its teacher, and the teacher's log-prob of each
    response token given what precedes it lands in ``teacher_ids`` / ``teacher_logprobs`` (zeros past the response);
    validation asks no teacher."""
    from tests.experimental.test_agent_loop import PROMPT_LEN, prompt_batch
    from verl.experimental.agent_loop.worker import AgentLoopWorkerBase
    from verl.experimental.served_model import served_model_worker_config, start_model_servers

    config, paths, assets = teachers
    config.distillation.distillation_loss.loss_mode = "k3"
    config.actor_rollout_ref.rollout.prompt_length, config.actor_rollout_ref.rollout.response_length = PROMPT_LEN, 6
    teacher_pool = RayResourcePool([2], use_gpu=False, max_colocate_count=1, name_prefix="teacher_pool_loop")
    policy_pool = RayResourcePool([1], use_gpu=False, max_colocate_count=1, name_prefix="policy_pool_loop")
    manager = MultiTeacherModelManager(config, teacher_pool)
    policy_config = served_model_worker_config(config, paths["gsm8k"], {})
    group, handles = start_model_servers(policy_pool, policy_config, "policy")
    try:
        worker = AgentLoopWorkerBase(config, handles, teacher_client=manager.get_client())
        routes = ["gsm8k", "apps", "apps", "gsm8k"]
        prompts = prompt_batch(assets, rows=4, data_source=routes)
        prompts.meta_info.update({"do_sample": False, "global_steps": 1})
        out = asyncio.run(worker.generate_sequences(prompts))
        ids, log_probs = out.batch["teacher_ids"], out.batch["teacher_logprobs"]
        assert ids.shape == log_probs.shape == (4, 6, 1)
        mask = out.batch["response_mask"].bool()
        for i, route in enumerate(routes):
            prompt = list(prompts.non_tensor_batch["raw_prompt_ids"][i])
            response = out.batch["responses"][i][mask[i]].tolist()
            expected = forward_log_probs(paths[route], prompt + response)  # row p predicts token p + 1
            start = len(prompt) - 1
            want = expected[start : start + len(response)].gather(-1, torch.tensor(response)[:, None])
            assert ids[i, : len(response), 0].tolist() == response
            assert torch.allclose(log_probs[i, : len(response)], want, atol=1e-5), route
            assert not log_probs[i, len(response) :].any()
        prompts.meta_info["validate"] = True
        assert "teacher_logprobs" not in asyncio.run(worker.generate_sequences(prompts)).batch.keys()
    finally:
        group.shutdown()
        manager.shutdown()
        teacher_pool.release()
        policy_pool.release()
