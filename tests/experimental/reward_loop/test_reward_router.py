"""A served reward model: its replicas (rollout servers of the demo model, hf engine) behind the router, reached
from a reward function written for veRL (it POSTs OpenAI-format requests to ``reward_router_address``)."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import ray
import torch
from omegaconf import OmegaConf

from tests.trainer.ppo.test_reward import batch
from verl.experimental.agent_loop.server_manager import AsyncLLMServerManager
from verl.experimental.reward_loop.reward_manager.discriminative import DiscriminativeRewardManager
from verl.experimental.reward_loop.reward_model import RewardModelManager, reward_model_worker_config
from verl.experimental.reward_loop.router import reward_router
from verl.single_controller.ray import RayResourcePool
from verl.trainer.config.compose import compose_config
from verl.trainer.config.errors import ConfigError
from verl.trainer.config.validate import validate_config
from verl.trainer.ppo.reward import load_reward_manager
from verl.utils.demo import ensure_demo_assets
from verl.utils.hf_tokenizer import hf_tokenizer
from verl.utils.import_utils import load_extern_object
from verl.workers.engine.hf_model import load_hf_model
from verl.workers.reward_manager.abstract import RewardFunctionError

EXAMPLE_JUDGE = Path(__file__).resolve().parents[3] / "examples" / "generative_reward" / "judge_reward.py"

# veRL's generative-judge pattern: the function prompts the judge through the router and parses its text
JUDGE = """
import json, urllib.request

def compute_score(data_source, solution_str, ground_truth, extra_info=None, reward_router_address=None,
                  reward_model_tokenizer=None):
    question = f"Is {solution_str!r} the answer {ground_truth!r}?"
    body = {"model": "judge", "messages": [{"role": "user", "content": question}], "max_tokens": 6, "temperature": 0}
    request = urllib.request.Request(f"http://{reward_router_address}/v1/chat/completions",
                                     data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as reply:
        text = json.load(reply)["choices"][0]["message"]["content"]
    return {"score": float(len(text) % 2), "judge_text": text, "tokens": len(reward_model_tokenizer.encode(text))}
"""


def post(address: str, route: str, body: object) -> tuple[int, dict]:
    request = urllib.request.Request(
        f"http://{address}{route}", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, json.load(reply)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


@pytest.fixture(scope="module")
def judge_config(tmp_path_factory):
    assets = ensure_demo_assets(tmp_path_factory.getbasetemp() / "verl_cache")
    judge_file = tmp_path_factory.mktemp("judge") / "judge.py"
    judge_file.write_text(JUDGE)
    config = compose_config("ppo_trainer")
    config.actor_rollout_ref.model.path = assets.model_path
    config.trainer.device = "cpu"
    config.reward.custom_reward_function.path = str(judge_file)
    rm = config.reward.reward_model
    rm.enable, rm.enable_resource_pool, rm.n_gpus_per_node, rm.nnodes = True, True, 1, 1
    rm.model_path = assets.model_path
    rm.rollout.dtype, rm.rollout.prompt_length, rm.rollout.response_length = "float32", 64, 16
    return config


def test_the_judge_is_reached_from_a_verl_reward_function_through_the_router(ray_cluster, judge_config):
    tokenizer = hf_tokenizer(judge_config.reward.reward_model.model_path)
    reward_fn = load_reward_manager(judge_config, tokenizer)  # starts the router: its address reaches the function
    router, address = reward_router(judge_config)
    status, _ = post(address, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
    assert status == 503  # no replica yet
    pool = RayResourcePool([1], use_gpu=False, max_colocate_count=1, name_prefix="reward_pool")
    manager = RewardModelManager(judge_config, pool, router)
    assert manager.get_router_address() == address
    try:
        data = batch(tokenizer, ["7", "3", "12"], ["7", "4", "12"])
        out = reward_fn(data, return_dict=True)
        texts = out["reward_extra_info"]["judge_text"]
        assert out["reward_metrics"] == {"reward/error_count": 0, "reward/timeout_count": 0}
        assert out["reward_tensor"].sum(-1).tolist() == [float(len(t) % 2) for t in texts]
        # the judge's words are the engine's own: the same prompt sent to the replica directly, greedy
        messages = [{"role": "user", "content": "Is '3' the answer '4'?"}]
        prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        client = AsyncLLMServerManager(None, manager.handles)
        direct = asyncio.run(
            client.generate("direct", prompt_ids=ids, sampling_params={"max_tokens": 6, "temperature": 0.0})
        )
        assert texts[1] == tokenizer.decode(direct.token_ids, skip_special_tokens=True) and len(direct.token_ids) > 0
        assert out["reward_extra_info"]["tokens"][1] == len(tokenizer.encode(texts[1]))  # the judge's tokenizer
        # /v1/completions, n > 1, usage, and requests answered 400 naming what is wrong
        status, reply = post(address, "/v1/completions", {"prompt": prompt, "max_tokens": 3, "n": 2, "seed": 1})
        assert status == 200 and len(reply["choices"]) == 2 and reply["usage"]["completion_tokens"] <= 6
        assert reply["choices"][0]["finish_reason"] in ("stop", "length") and reply["object"] == "text_completion"
        assert post(address, "/v1/chat/completions", {"messages": []}) == (
            400,
            {
                "error": {
                    "message": "'messages' must be a non-empty list of {'role', 'content'} objects",
                    "type": "invalid_request_error",
                }
            },
        )
        status, reply = post(address, "/v1/completions", {"prompt": "x", "max_tokens": 0})
        assert status == 400 and "max_tokens=0 must be positive" in reply["error"]["message"]
        assert ray.get(router.stats.remote())["served"] == 4  # three judge calls and one completion
        # the generative-reward example's function, through the same router: this judge is untrained, so its
        # verdict does not parse, and the sample fails (it is counted; it never scores a silent 0)
        example = load_extern_object(str(EXAMPLE_JUDGE), "compute_score")
        with pytest.raises(ValueError, match=r"the judge's verdict '.*' is not 'score: 0' … 'score: 6'"):
            example("verl/arithmetic", "7", "7", reward_router_address=address, reward_model_tokenizer=tokenizer)
        # asleep, the replica holds far less; woken, it reloaded the judge's weights from its path: the same verdicts
        awake = manager.worker_group.wake_up()[0]  # what an awake replica holds (waking it changes nothing)
        asleep = manager.sleep()[0]
        assert asleep < awake / 10, (asleep, awake)
        manager.wake_up()
        assert reward_fn(data, return_dict=True)["reward_extra_info"]["judge_text"] == texts
        # a dead replica is named by role and rank; a judge that fails on every sample stops the run, naming it
        ray.kill(manager.worker_group.workers[0])
        status, reply = post(address, "/v1/completions", {"prompt": "x"})
        assert status == 500 and reply["error"]["message"].startswith("reward_model rank 0 failed: ActorDiedError")
        with pytest.raises(RewardFunctionError, match=r"compute_score \(.*judge.py\) failed on every one of the 3"):
            reward_fn(data)
    finally:
        manager.worker_group.shutdown()
        pool.release()


def test_a_served_judge_is_validated_at_start_up(judge_config):
    config = OmegaConf.create(OmegaConf.to_container(judge_config))
    config.reward.reward_model.enable_resource_pool = False  # beside the training workers: not in separate_async
    config.reward.reward_model.rollout.name = "nope"
    config.trainer.v1.trainer_mode = "separate_async"
    with pytest.raises(ConfigError) as error:
        validate_config(config)
    message = str(error.value)
    assert "trainer.v1.trainer_mode=separate_async: a served reward model needs a pool of its own" in message
    assert "reward.reward_model.rollout.name='nope'" in message
    worker = reward_model_worker_config(judge_config)  # the policy's rollout settings under the judge's
    assert worker.model.path == judge_config.reward.reward_model.model_path and worker.rollout.response_length == 16
    assert worker.rollout.seed == 42 and worker.rollout.n == 1


def test_a_discriminative_reward_models_score_is_the_reward(ray_cluster, judge_config, tmp_path):
    """veRL's rule without a custom function: the chat (prompt messages + response) rendered with the reward model's
    template, sent to /classify, the last output of the last sequence is the reward."""
    source = judge_config.reward.reward_model.model_path
    classifier = load_hf_model(source, value_model=True, dtype=torch.float32, seed=3)  # a scalar head on the demo
    classifier.save_pretrained(tmp_path / "rm")
    tokenizer = hf_tokenizer(source)
    tokenizer.save_pretrained(tmp_path / "rm")
    config = OmegaConf.create(OmegaConf.to_container(judge_config))
    config.reward.custom_reward_function.path = None
    config.reward.reward_model.model_path = str(tmp_path / "rm")
    reward_fn = load_reward_manager(config, tokenizer)
    assert isinstance(reward_fn.manager, DiscriminativeRewardManager)
    router, address = reward_router(config)
    pool = RayResourcePool([1], use_gpu=False, max_colocate_count=1, name_prefix="reward_pool_dis")
    manager = RewardModelManager(config, pool, router)
    try:
        assert manager.discriminative
        data = batch(tokenizer, ["7", "3", "12"], ["7", "4", "12"])
        questions = ["What is 3 + 4?", "What is 5 - 1?", "What is 6 + 6?"]
        data.non_tensor_batch["raw_prompt"] = np.array(
            [[{"role": "user", "content": q}] for q in questions], dtype=object
        )
        out = reward_fn(data, return_dict=True)
        expected = []
        for i, question in enumerate(questions):
            response = tokenizer.decode(data.batch["responses"][i][data.batch["attention_mask"][i, 4:].bool()].tolist())
            chat = [
                {"role": "user", "content": question},
                {"role": "assistant", "content": response.replace(tokenizer.eos_token, "")},
            ]
            ids = tokenizer(tokenizer.apply_chat_template(chat, add_generation_prompt=False, tokenize=False))[
                "input_ids"
            ]
            with torch.no_grad():
                expected.append(classifier(input_ids=torch.tensor([ids])).logits[0, -1, 0].item())
        torch.testing.assert_close(out["reward_tensor"].sum(-1), torch.tensor(expected), rtol=0, atol=1e-5)
        status, reply = post(address, "/classify", {"input": [[5, 6, 7]], "use_activation": True})
        assert status == 200 and 0 < reply["data"][0]["probs"][0] < 1 and reply["data"][0]["num_classes"] == 1
    finally:
        manager.worker_group.shutdown()
        pool.release()


@pytest.mark.vllm
def test_the_judge_on_the_vllm_engine(ray_cluster, judge_config):
    """The same judge served by vLLM (the vllm venv): the router's chat completions come from its engine."""
    pytest.importorskip("vllm", reason="runs in the vllm venv")
    config = OmegaConf.create(OmegaConf.to_container(judge_config))
    rm = config.reward.reward_model
    rm.rollout.name, rm.rollout.load_format, rm.rollout.tensor_model_parallel_size = "vllm", "auto", 1
    router, address = reward_router(config)
    pool = RayResourcePool([1], use_gpu=False, max_colocate_count=1, name_prefix="reward_pool_vllm")
    manager = RewardModelManager(config, pool, router)
    try:
        assert not manager.discriminative
        body = {"messages": [{"role": "user", "content": "Is 7 the answer?"}], "max_tokens": 4, "temperature": 0}
        status, reply = post(address, "/v1/chat/completions", {**body, "n": 2})
        assert status == 200 and len(reply["choices"]) == 2 and 0 < reply["usage"]["completion_tokens"] <= 8
        first, second = (c["message"]["content"] for c in reply["choices"])
        assert first == second  # greedy: both samples the engine's same answer
    finally:
        manager.worker_group.shutdown()
        pool.release()
