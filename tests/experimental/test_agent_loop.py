"""The AgentLoop for real: 2 hybrid Ray workers (FSDP2 on gloo + the hf engine, the demo model) serving requests,
the agent-loop worker actor, veRL-style user loops from a YAML file, and ``main_ppo`` training through a user loop."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import ray
import torch
from omegaconf import OmegaConf

from tests.cli_runs import Prepared, cli_run, needs
from tests.workers.engine_requests import generate
from verl.experimental.agent_loop import AgentLoopManager, AgentLoopOutput, AsyncLLMServerManager, DictConfigWrap
from verl.experimental.agent_loop.agent_loop import agent_loop_target, load_agent_loop_configs
from verl.experimental.agent_loop.postprocess import version_ranges
from verl.experimental.agent_loop.server_manager import ServerHandle
from verl.experimental.reward_loop.rate_limits import RateLimitSettings, shared_rate_limits
from verl.experimental.reward_loop.reward_fn import RewardLoopFunction
from verl.experimental.reward_loop.reward_manager import RateLimitedRewardManager
from verl.protocol import DataProto
from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
from verl.single_controller.ray.base import create_colocated_worker_cls
from verl.utils.dataset.rl_dataset import collate_fn, create_rl_dataset
from verl.utils.demo import ensure_demo_assets
from verl.utils.tokenizer import hf_tokenizer
from verl.workers.fsdp_workers import ActorRolloutRefWorker
from verl.workers.reward_manager import NaiveRewardManager

HERE = Path(__file__).parent
PROMPT_LEN, RESPONSE_LEN, ROWS = 32, 48, 6


# ---------------------------------------------------------------------------------------------- no Ray needed
def test_agent_loop_output_accepts_veRL_forms_and_rejects_bad_lengths():
    metrics = {"generate_sequences": 1.5}
    out = AgentLoopOutput(prompt_ids=[1], response_ids=[2, 3], response_mask=[1, 0], metrics=metrics)
    assert out.metrics.generate_sequences == 1.5 and out.metrics.tool_calls == 0.0 and out.num_turns == 0
    with pytest.raises(ValueError, match="response_mask has 1 entries for 2 response_ids"):
        AgentLoopOutput(prompt_ids=[1], response_ids=[2, 3], response_mask=[1])
    with pytest.raises(ValueError, match="response_logprobs has 1 entries"):
        AgentLoopOutput(prompt_ids=[1], response_ids=[2, 3], response_mask=[1, 1], response_logprobs=[0.0])


def test_version_ranges_follow_the_generated_tokens():
    # two model turns (versions 3, then 4 after a push) around a tool turn (mask 0): it takes the version before it
    assert version_ranges([1, 1, 0, 0, 1], [3, 3, 4]) == [[0, 4, 3], [4, 5, 4]]
    assert version_ranges([0, 1, 1], [2, 3]) == [[0, 2, 2], [2, 3, 3]]  # a leading user turn: the first version
    assert version_ranges([1, 1], []) == []  # nothing recorded


def test_agent_loop_yaml_errors_name_the_file_and_entry(tmp_path):
    with pytest.raises(ValueError, match="not registered.*single_turn_agent"):
        agent_loop_target("nobody")
    with pytest.raises(FileNotFoundError, match="agent_loop_config_path='/nope.yaml'"):
        load_agent_loop_configs("/nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("- name: x\n")
    with pytest.raises(ValueError, match=r"bad.yaml.*entry 0 needs 'name' and '_target_'"):
        load_agent_loop_configs(str(bad))
    bad.write_text("- name: x\n  _target_: no_such_module.Loop\n")
    with pytest.raises(ImportError, match=r"entry 0 \(x\): cannot import 'no_such_module.Loop'"):
        load_agent_loop_configs(str(bad))
    bad.write_text("- name: x\n  _target_: collections.OrderedDict\n")
    with pytest.raises(TypeError, match="not an AgentLoopBase subclass"):
        load_agent_loop_configs(str(bad))


def test_prompt_ids_from_a_tokenizer_are_accepted_and_bad_ones_named():
    from verl.utils.demo import build_demo_tokenizer
    from verl.workers.rollout.request import as_token_ids

    tokenizer = build_demo_tokenizer()

    messages = [{"role": "user", "content": "What is 3 + 4?"}]
    encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)  # a BatchEncoding
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert as_token_ids(encoded) == ids == as_token_ids(torch.tensor([ids])) == as_token_ids(ids)
    with pytest.raises(ValueError, match=r"generate\('r1'\): prompt_ids\[1\]='a' \(str\) is not a token id"):
        as_token_ids([5, "a"], "generate('r1'): prompt_ids")
    with pytest.raises(ValueError, match="a mapping without 'input_ids'"):
        as_token_ids({"ids": [1]})
    with pytest.raises(ValueError, match="AgentLoopOutput.prompt_ids"):
        AgentLoopOutput(prompt_ids="hello", response_ids=[1], response_mask=[1])
    assert AgentLoopOutput(prompt_ids=encoded, response_ids=[1], response_mask=[1]).prompt_ids == ids


def test_agent_loop_manager_class_replaces_the_manager():
    from types import SimpleNamespace

    from verl.trainer.ppo.rollout_manager import create_rollout_manager, route_generation

    config = OmegaConf.create(
        {"actor_rollout_ref": {"rollout": {"agent": {"agent_loop_manager_class": "user_agent_loops.RecordingManager"}}}}
    )
    group = SimpleNamespace(generate_sequences="the engines' batch call")
    sys.path.insert(0, str(HERE))
    try:
        manager = create_rollout_manager(config, group, tokenizer=None, step=lambda: 0)
    finally:
        sys.path.remove(str(HERE))
    assert type(manager).__name__ == "RecordingManager" and manager.worker_group is group and manager.config is config
    route_generation(manager, [group])
    assert group.generate_sequences == "the engines' batch call"  # a manager without the per-prompt call: untouched
    config.actor_rollout_ref.rollout.agent.agent_loop_manager_class = "user_agent_loops.Nope"
    with pytest.raises(ImportError, match="agent_loop_manager_class='user_agent_loops.Nope' cannot be imported"):
        create_rollout_manager(config, group, tokenizer=None, step=lambda: 0)


# ---------------------------------------------------------------------------------------------- the servers
@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return ensure_demo_assets(tmp_path_factory.getbasetemp() / "verl_cache")  # the cache the CLI runs share


def write_loops_yaml(folder: Path, module: str) -> str:
    """The user loops listed in a YAML file, as ``<module>.<Class>``."""
    path = folder / "agent_loops.yaml"
    path.write_text(
        textwrap.dedent(
            f"""\
            - name: two_turn
              _target_: {module}.TwoTurnAgentLoop
              observation: " ok"
            - name: short_first
              _target_: {module}.ShortFirstAgentLoop
            - name: self_scored
              _target_: {module}.SelfScoredAgentLoop
            - name: flaky
              _target_: {module}.FlakyAgentLoop
            - name: drafts
              _target_: {module}.DraftsAgentLoop
            """
        )
    )
    return str(path)


def trainer_config(model_path: str, loops_yaml: str | None = None):
    return OmegaConf.create(
        {
            "actor_rollout_ref": {
                "model": {"path": model_path, "enable_gradient_checkpointing": False},
                "actor": {
                    "strategy": "fsdp2",
                    "ppo_mini_batch_size": 2,
                    "ppo_micro_batch_size_per_gpu": 2,
                    "fsdp_config": {"dtype": "float32"},
                    "use_kl_loss": False,
                },
                "rollout": {
                    "name": "hf",
                    "dtype": "float32",
                    "n": 2,
                    "prompt_length": PROMPT_LEN,
                    "response_length": RESPONSE_LEN,
                    "max_model_len": 512,
                    "log_prob_micro_batch_size_per_gpu": 4,
                    "free_cache_engine": False,
                    "seed": 7,
                    "agent": {"agent_loop_config_path": loops_yaml},
                },
            },
            "data": {"max_prompt_length": PROMPT_LEN},
        }
    )


@pytest.fixture(scope="module")
def hybrid(ray_cluster, assets, tmp_path_factory):
    """2 fused actor_rollout workers (as the trainer builds them) and an agent-loop manager over them. The Ray
    workers import the user loops' module from the checkout (their working directory is the session's)."""
    loops = write_loops_yaml(tmp_path_factory.mktemp("loops"), "tests.experimental.user_agent_loops")
    config = trainer_config(assets.model_path, loops)
    pool = RayResourcePool([2], use_gpu=False, max_colocate_count=1)
    cls = RayClassWithInitArgs(ActorRolloutRefWorker, config=config.actor_rollout_ref, role="actor_rollout")
    fused = create_colocated_worker_cls({"actor_rollout": cls})
    wg = RayWorkerGroup(pool, fused, name_prefix="agentloop_").spawn(["actor_rollout"])["actor_rollout"]
    wg.init_model()
    manager = AgentLoopManager(config, wg, tokenizer=hf_tokenizer(assets.model_path))
    yield config, wg, manager
    wg.shutdown()
    pool.release()


def prompt_batch(assets, rows: int = ROWS, **columns) -> DataProto:
    tokenizer = hf_tokenizer(assets.model_path)
    data_config = OmegaConf.create({"max_prompt_length": PROMPT_LEN})
    dataset = create_rl_dataset(assets.val_files, data_config, tokenizer, is_train=False, max_samples=rows)
    batch = DataProto.from_single_dict(collate_fn([dataset[i] for i in range(rows)]))
    for key, values in columns.items():
        batch.non_tensor_batch[key] = np.array(values, dtype=object)
    batch.meta_info = {"eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id}
    return batch


def engine_batch_call(config, wg, rank: int, rows: DataProto) -> DataProto:
    """The engine's own batch of ``rows`` on one rank: every sample's request submitted together, bypassing the
    agent loops (tests/workers/engine_requests.py)."""
    model_path = config.actor_rollout_ref.model.path
    return generate(wg, rows, config.actor_rollout_ref.rollout, model_path=model_path, ranks=[rank])


def test_single_turn_agent_loop_equals_the_engines_batch_call(hybrid, assets):
    """The AgentLoop path (manager → agent-loop worker → server manager → the workers' server methods) gives the
    tokens and log-probs of the engines' own batch call on the same samples, bit for bit, sampled and greedy: the
    first requests of a batch reach each replica as one wave, so each engine batches exactly what the batch call
    batches (sample k goes to replica k % 2)."""
    config, wg, manager = hybrid
    for meta, n in (({"global_steps": 3}, 2), ({"global_steps": 3, "validate": True}, 1)):
        prompts = prompt_batch(assets)
        prompts.meta_info.update(meta)
        prompts.batch["prompt_index"] = torch.arange(len(prompts))  # the n samples of a prompt share its index
        looped = manager.generate_sequences(prompts.repeat(n, interleave=True))
        assert len(looped) == ROWS * n
        samples = prompts.select(batch_keys=["input_ids", "attention_mask", "position_ids"]).repeat(n)
        samples.batch["prompt_index"] = torch.arange(len(samples)) // n
        samples.batch["sample_index"] = torch.arange(len(samples)) % n
        samples.meta_info["n"] = 1
        for rank in (0, 1):
            rows = list(range(rank, len(samples), 2))
            direct = engine_batch_call(config, wg, rank, samples.select_idxs(rows))
            for key in ("prompts", "responses", "attention_mask", "position_ids", "response_mask"):
                assert torch.equal(looped.batch[key][rows], direct.batch[key]), (meta, rank, key)
            assert torch.equal(looped.batch["rollout_log_probs"][rows], direct.batch["rollout_log_probs"])
        assert list(looped.non_tensor_batch["__num_turns__"]) == [2] * len(looped)
        metrics = looped.meta_info["metrics"]
        assert metrics["agent_loop/generate_sequences/max"] >= metrics["agent_loop/generate_sequences/mean"] > 0
        assert {"agent_loop/slowest/prompt_length", "agent_loop/num_preempted/mean"} <= set(metrics)
        assert looped.meta_info["timing"]["generate_sequences"] > 0


def engine_progress(wg, rank: int, request_id: str) -> ray.ObjectRef:
    """Tokens the request ``request_id`` has generated so far in rank ``rank``'s engine (None: not in flight there),
    read in the worker's process (a ref: ``ray.get`` or ``await`` it)."""
    role = wg.method_prefix.removesuffix("_")
    return wg.workers[rank].__ray_call__.remote(lambda worker: worker.worker_dict[role].rollout.progress(request_id))


async def until_generating(wg, where: dict[str, int], timeout: float = 30) -> None:
    """Until each request of ``where`` (server-side id → rank) has generated a token in its rank's engine."""
    deadline = time.monotonic() + timeout
    while True:
        progress = dict(zip(where, await asyncio.gather(*(engine_progress(wg, r, i) for i, r in where.items()))))
        if all(progress.values()):
            return
        assert time.monotonic() < deadline, f"not all generating in their engines after {timeout} s: {progress}"
        await asyncio.sleep(0.01)


def test_server_manager_routes_least_loaded_keeps_conversations_and_aborts(hybrid, assets):
    config, wg, manager = hybrid
    handles = [ServerHandle(actor, wg.method_prefix, f"rank {i}") for i, actor in enumerate(wg.workers)]
    prompt = prompt_batch(assets, rows=1).non_tensor_batch["raw_prompt_ids"][0]
    long = {"max_tokens": 400, "ignore_eos": True, "temperature": 1.0, "seed": 1}

    async def scenario():
        servers = AsyncLLMServerManager(config, handles)

        def start(conversation: str) -> asyncio.Task:
            return asyncio.create_task(servers.generate(conversation, prompt_ids=prompt, sampling_params=long))

        first = [start(f"c{i}") for i in range(4)]
        await asyncio.sleep(0)  # each task routes its request as it starts, before it awaits the server
        assert [servers.server_of(f"c{i}") for i in range(4)] == [0, 1, 0, 1] and servers.outstanding == [2, 2]
        await until_generating(wg, {"c0/0": 0, "c3/0": 1})  # in their engines, so the abort finds them
        aborted = await servers.abort(["c0", "c3"])
        assert sorted(aborted) == ["c0", "c3"]
        outputs = await asyncio.gather(*first)
        assert [o.stop_reason for o in outputs] == ["aborted", "completed", "completed", "aborted"]
        assert 0 < len(outputs[0].token_ids) < 400 and len(outputs[1].token_ids) == 400
        # a later turn of c0 stays on c0's server (0) although server 1 is the less loaded one now
        others = [start(f"c{i}") for i in (4, 5, 6)]
        await asyncio.sleep(0)
        assert [servers.server_of(f"c{i}") for i in (4, 5, 6)] == [0, 1, 0] and servers.outstanding == [2, 1]
        await until_generating(wg, {"c4/0": 0, "c5/0": 1, "c6/0": 0})  # for the abort(None) below
        turn = asyncio.create_task(servers.generate("c0", prompt_ids=prompt, sampling_params={"max_tokens": 2}))
        await asyncio.sleep(0)
        assert servers.server_of("c0") == 0 and servers.outstanding == [3, 1]
        assert (await turn).stop_reason == "completed"
        await servers.abort(None)
        assert [(await task).stop_reason for task in others] == ["aborted"] * 3

    asyncio.run(scenario())


def test_no_training_call_while_generation_is_in_flight(hybrid, assets):
    _, wg, _ = hybrid
    prompt = prompt_batch(assets, rows=1).non_tensor_batch["raw_prompt_ids"][0]
    handle = ServerHandle(wg.workers[0], wg.method_prefix)
    ref = handle.generate.remote("busy", prompt_ids=prompt, sampling_params={"max_tokens": 400, "ignore_eos": True})
    asyncio.run(until_generating(wg, {"busy": 0}))
    with pytest.raises(Exception, match=r"update_weights: 1 generation request\(s\) are in flight"):
        wg.update_weights()
    ray.get(handle.abort_requests.remote(["busy"]))
    assert ray.get(ref).stop_reason == "aborted"
    wg.update_weights()  # idle again: allowed


def test_rollout_traces_reach_mlflow_without_changing_the_batch(hybrid, assets, tmp_path, monkeypatch):
    """``rollout.trace`` with mlflow (a local sqlite store): with ``max_samples_per_step_per_worker=1`` the n copies of
    one prompt are traced, each as an ``agent_loop`` span tagged with its sample, holding the loop's run and its
    generate call with the decoded texts (``token2text``); the batch equals the untraced one."""
    import mlflow

    from verl.utils.rollout_trace import RolloutTraceConfig

    config, wg, untraced_manager = hybrid
    prompts = prompt_batch(assets)
    prompts.meta_info["global_steps"] = 3
    prompts.batch["prompt_index"] = torch.arange(len(prompts))  # the n samples of a prompt share its index
    plain = untraced_manager.generate_sequences(prompts.repeat(2, interleave=True))
    traced_config = OmegaConf.merge(config, {"trainer": {"project_name": "verl_trace", "experiment_name": "t1"}})
    trace = {"backend": "mlflow", "token2text": True, "max_samples_per_step_per_worker": 1}
    traced_config.actor_rollout_ref.rollout.trace = trace
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlruns.db")
    mlflow.set_tracking_uri(os.environ["MLFLOW_TRACKING_URI"])
    mlflow.create_experiment("verl_trace", artifact_location=str(tmp_path / "artifacts"))  # not ./mlruns
    RolloutTraceConfig.reset()  # the process's first agent-loop worker set it up untraced
    try:
        manager = AgentLoopManager(traced_config, wg, tokenizer=hf_tokenizer(assets.model_path))
        traced = manager.generate_sequences(prompts.repeat(2, interleave=True))
        mlflow.flush_trace_async_logging()
    finally:
        RolloutTraceConfig.reset()
    for key in ("responses", "rollout_log_probs", "attention_mask"):
        assert torch.equal(traced.batch[key], plain.batch[key]), key
    experiment = mlflow.get_experiment_by_name("verl_trace").experiment_id
    found = mlflow.search_traces(return_type="list", locations=[experiment])
    assert len(found) == 2
    tags = [t.info.tags for t in found]
    assert {t["rollout_n"] for t in tags} == {"0", "1"} and len({t["sample_index"] for t in tags}) == 1
    assert all(t["step"] == "3" and t["experiment_name"] == "t1" for t in tags)
    tokenizer = hf_tokenizer(assets.model_path)
    prompt = [str(i) for i in prompts.non_tensor_batch["index"]].index(tags[0]["sample_index"])  # the dataset's
    row = 2 * prompt + int(tags[0]["rollout_n"])
    response = traced.batch["responses"][row][traced.batch["response_mask"][row].bool()].tolist()
    spans = {s.name: s for s in found[0].data.spans}
    assert set(spans) == {"agent_loop", "SingleTurnAgentLoop.run", "AsyncLLMServerManager.generate"}
    assert spans["SingleTurnAgentLoop.run"].parent_id == spans["agent_loop"].span_id
    assert spans["AsyncLLMServerManager.generate"].parent_id == spans["SingleTurnAgentLoop.run"].span_id
    assert spans["AsyncLLMServerManager.generate"].outputs["response_text"] == tokenizer.decode(response)


def test_user_loops_from_yaml_mask_their_tokens_and_rewards_score_samples_as_they_finish(hybrid, assets, tmp_path):
    config, wg, _ = hybrid
    tokenizer = hf_tokenizer(assets.model_path)
    stamps = tmp_path / "scored.jsonl"
    reward_file = tmp_path / "reward.py"
    reward_file.write_text(
        textwrap.dedent(
            f"""\
            import json, time

            def compute_score(data_source, solution_str, ground_truth, extra_info=None):
                with open({str(stamps)!r}, "a") as f:
                    f.write(json.dumps({{"index": extra_info["index"], "at": time.time()}}) + "\\n")
                return {{"score": 0.5, "length": len(solution_str)}}
            """
        )
    )
    from verl.utils.reward_score.custom import FileFunction

    score = FileFunction(str(reward_file), "compute_score")
    reward_fn = NaiveRewardManager(tokenizer, compute_score=score, num_workers=0)
    manager = AgentLoopManager(config, wg, tokenizer=tokenizer, reward_fn=reward_fn)
    names = ["short_first", "short_first", "short_first", "two_turn", "self_scored", "single_turn_agent"]
    prompts = prompt_batch(assets, agent_name=names, short=[True] + [False] * (ROWS - 1))
    index = list(prompts.non_tensor_batch["index"])
    wg.update_weights(version=5)  # a push naming its version: every token below is generated by version 5
    out = manager.generate_sequences(prompts)
    b, nt = out.batch, out.non_tensor_batch
    # each sample records the version of each response token (the user loops never mention versions)
    lengths = b["attention_mask"][:, PROMPT_LEN:].sum(-1).tolist()
    assert list(nt["weight_version_ranges"]) == [[[0, n, 5]] for n in lengths]
    assert list(nt["min_global_steps"]) == list(nt["max_global_steps"]) == [5] * ROWS  # veRL 0.10's names
    assert list(nt["__num_turns__"]) == [2, 2, 2, 3, 2, 2]
    # two_turn: the observation's tokens are in the response but masked out (not generated), log-prob 0 there
    cut = int(nt["observation_at"][3])
    observation = tokenizer.encode(" ok", add_special_tokens=False)
    assert b["responses"][3, cut : cut + len(observation)].tolist() == observation
    assert b["response_mask"][3, cut : cut + len(observation)].tolist() == [0] * len(observation)
    assert b["response_mask"][3, :cut].tolist() == [1] * cut
    assert torch.all(b["rollout_log_probs"][3, cut : cut + len(observation)] == 0)
    # rewards: at the last response token; the self-scored loop's own score, the reward function's for the rest
    last = b["attention_mask"][:, PROMPT_LEN:].sum(-1) - 1
    scores = b["rm_scores"][torch.arange(ROWS), last]
    assert scores.tolist() == [0.5, 0.5, 0.5, 0.5, 0.25, 0.5] and b["rm_scores"].sum().item() == pytest.approx(2.75)
    assert out.meta_info["reward_extra_keys"] == ["score", "length"] and nt["length"][4] == 0.0  # not scored by the fn
    # self_scored passed the tokenizer's BatchEncoding on: its prompt is the dataset's prompt ids
    prompt_4 = b["prompts"][4][b["attention_mask"][4, :PROMPT_LEN].bool()].tolist()
    assert prompt_4 == list(prompts.non_tensor_batch["raw_prompt_ids"][4])
    assert out.meta_info["metrics"]["reward/error_count"] == 0
    scored = {row["index"]: row["at"] for row in map(json.loads, stamps.read_text().splitlines())}
    assert sorted(scored) == sorted(index[i] for i in (0, 1, 2, 3, 5))
    # the one-token sample was scored before the long ones had finished generating
    assert scored[index[0]] < max(nt["generated_at"][1], nt["generated_at"][2])
    # veRL 0.10's reward-loop contract: each finished sample's run_single awaited, within the run's rate limits
    settings = {"max_concurrent": 2, "max_rpm": 6000}
    limited = RateLimitedRewardManager(OmegaConf.create({"reward": settings}), tokenizer, score)
    again = AgentLoopManager(config, wg, tokenizer=tokenizer, reward_fn=RewardLoopFunction(limited))
    again = again.generate_sequences(prompts)
    assert torch.equal(again.batch["rm_scores"], b["rm_scores"])  # the same samples, the same scores
    assert again.meta_info["reward_extra_keys"] == ["score", "length"]
    stats = asyncio.run(shared_rate_limits(RateLimitSettings(**settings)).stats())  # the agent-loop workers' limit
    assert len(stats["granted"]) == 5 and stats["max_in_flight"] <= 2


def test_a_loop_returning_several_outputs_gives_each_a_row_with_the_final_reward(hybrid, assets, tmp_path):
    """veRL 0.10's multi-output sessions: ``run`` returns a list; each output is a row (``__trajectory_index__``
    numbers a sample's rows), each with its own tokens and versions; the reward function scores the final output
    and its reward is every output's."""
    config, wg, _ = hybrid
    tokenizer = hf_tokenizer(assets.model_path)
    reward_file = tmp_path / "reward.py"
    reward_file.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return {'score': 1.0 + len(solution_str) % 5, 'chars': len(solution_str)}\n"
    )
    from verl.utils.reward_score.custom import FileFunction

    reward_fn = NaiveRewardManager(tokenizer, compute_score=FileFunction(str(reward_file), "compute_score"))
    manager = AgentLoopManager(config, wg, tokenizer=tokenizer, reward_fn=reward_fn)
    prompts = prompt_batch(assets, rows=4, agent_name=["drafts", "single_turn_agent", "drafts", "single_turn_agent"])
    wg.update_weights(version=6)
    out = manager.generate_sequences(prompts)
    b, nt = out.batch, out.non_tensor_batch
    assert len(out) == 6 and list(nt["__trajectory_index__"]) == [0, 1, 0, 0, 1, 0]
    ids = [b["input_ids"][r][b["attention_mask"][r].bool()].tolist() for r in range(6)]
    for draft, answer in ((0, 1), (3, 4)):
        answer_prompt = b["prompts"][answer][b["attention_mask"][answer, :PROMPT_LEN].bool()].tolist()
        assert answer_prompt == ids[draft][-PROMPT_LEN:]  # the draft's prompt and tokens, as the loop built it
        last = b["attention_mask"][[draft, answer], PROMPT_LEN:].sum(-1) - 1
        scores = b["rm_scores"][[draft, answer]][torch.arange(2), last]
        text = tokenizer.decode(b["responses"][answer][b["response_mask"][answer].bool()], skip_special_tokens=True)
        assert scores.tolist() == [1.0 + len(text) % 5] * 2  # the answer's score, given to its draft too
        assert nt["chars"][draft] == nt["chars"][answer] == len(text)
    lengths = b["attention_mask"][:, PROMPT_LEN:].sum(-1).tolist()
    assert list(nt["weight_version_ranges"]) == [[[0, n, 6]] for n in lengths]  # each row its own tokens' versions
    metrics = out.meta_info["metrics"]
    assert metrics["agent_loop/trajectories_per_sample/mean"] == 1.5
    assert metrics["agent_loop/trajectories_per_sample/max"] == 2


def test_failed_samples_are_kept_when_asked_and_a_loop_that_always_fails_stops(hybrid, assets, caplog):
    """The replay-buffer schedule asks for failed samples to be kept (meta_info["keep_failed_samples"]): a sample
    whose loop raised becomes a masked placeholder flagged in __failed__; one that fails everywhere still stops."""
    _, _, manager = hybrid
    fail = [False, True, False, False, True, False]
    prompts = prompt_batch(assets, agent_name=["flaky"] * ROWS, fail=fail)
    with pytest.raises(Exception, match="flaky: gave up on prompt"):  # not asked: the failure stops the batch
        manager.generate_sequences(prompts)
    prompts.meta_info["keep_failed_samples"] = True
    with caplog.at_level(logging.WARNING, logger="verl.experimental.agent_loop.failures"):
        out = manager.generate_sequences(prompts)
    b, nt = out.batch, out.non_tensor_batch
    assert list(nt["__failed__"]) == fail and len(out) == ROWS
    assert b["response_mask"][torch.tensor(fail)].sum() == 0 and b["response_mask"][~torch.tensor(fail)].sum() > 0
    prompt_1 = b["prompts"][1][b["attention_mask"][1, :PROMPT_LEN].bool()].tolist()
    assert prompt_1 == list(prompts.non_tensor_batch["raw_prompt_ids"][1])  # the prompt kept, for the group
    assert "2 of 6 samples failed in their agent loops" in caplog.text and "flaky: gave up on prompt" in caplog.text
    everywhere = prompt_batch(assets, agent_name=["flaky"] * ROWS, fail=[True] * ROWS)
    everywhere.meta_info["keep_failed_samples"] = True
    with pytest.raises(Exception, match="agent loop 'flaky': every one of the batch's"):
        manager.generate_sequences(everywhere)


def test_replicas_taken_out_of_the_routing_get_no_request_and_come_back(hybrid, assets):
    """The routing calls that lend the training workers' engines to generation: a removed replica is sent nothing
    (and removing every one is refused), an added one serves again, nothing is left in flight after a batch."""
    config, wg, _ = hybrid
    manager = AgentLoopManager(config, wg, tokenizer=hf_tokenizer(assets.model_path))  # its own counts
    handles = manager.replica_handles(wg)
    manager.remove_servers(handles[1:])
    manager.generate_sequences(prompt_batch(assets))
    assert manager.served_by(handles[1:]) == 0 and manager.served_by(handles[:1]) == ROWS
    with pytest.raises(ValueError, match="would leave no replica to route to"):
        manager.remove_servers(handles)
    manager.add_servers(handles[1:])
    manager.generate_sequences(prompt_batch(assets))
    assert manager.served_by(handles[1:]) > 0 and manager.served_by(handles) == 2 * ROWS
    manager.wait_drained(handles, timeout_s=5)  # the batches are done: nothing in flight


# ---------------------------------------------------------------------------------------------- main_ppo
@cli_run("user_agent_loops", cost_s=45)
def _user_agent_loops(work: Path) -> Prepared:
    """A veRL user's set-up: a parquet with an ``agent_name`` column, the loops listed in a YAML file, their module
    on PYTHONPATH; nothing else. One prompt in eight runs ``drafts`` (two outputs per sample): with n=3 a batch has
    27 rows, padded to 28 for the 2 ranks."""
    assets = ensure_demo_assets(work.parent / "verl_cache")
    train = pd.read_parquet(assets.train_files).head(32)
    train["agent_name"] = ["two_turn" if i % 2 else "drafts" if i % 8 == 2 else "single_turn_agent" for i in range(32)]
    train.to_parquet(work / "train.parquet")
    pd.read_parquet(assets.val_files).head(8).assign(agent_name="two_turn").to_parquet(work / "val.parquet")
    loops_yaml = write_loops_yaml(work, "user_agent_loops")
    overrides = [
        f"actor_rollout_ref.model.path={assets.model_path}",
        f"data.train_files={work / 'train.parquet'}",
        f"data.val_files={work / 'val.parquet'}",
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={loops_yaml}",
        "data.train_batch_size=8",
        "data.shuffle=false",
        "data.max_prompt_length=32",
        "data.max_response_length=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=12",
        "actor_rollout_ref.actor.use_kl_loss=false",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
        "actor_rollout_ref.actor.fsdp_config.dtype=float32",
        "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.rollout.dtype=float32",
        "actor_rollout_ref.rollout.n=3",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "algorithm.adv_estimator=grpo",
        "trainer.n_gpus_per_node=2",
        "trainer.total_training_steps=2",
        "trainer.val_before_train=true",
        "trainer.test_freq=2",
    ]
    return Prepared(overrides, {"PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])})


@needs("user_agent_loops")
def test_main_ppo_trains_and_validates_through_a_user_agent_loop_from_yaml(cli_runs):
    code, output, records, _ = cli_runs["user_agent_loops"]
    assert code == 0, output[-4000:]
    by_step = {r["step"]: r["data"] for r in records if r.get("data")}
    for step in (1, 2):
        data = by_step[step]
        assert data["num_turns/mean"] == 2.5 and data["num_turns/max"] == 3, data  # over the final outputs
        assert data["agent_loop/trajectories_per_sample/mean"] == 27 / 24  # one prompt's 3 samples had a draft
        assert data["agent_loop/trajectories_per_sample/max"] == 2
        assert data["training/num_turns/mean"] == 2.5 and data["training/num_turns/min"] == data["num_turns/min"]
        assert data["agent_loop/generate_sequences/max"] > 0 and "agent_loop/slowest/response_length" in data
        assert np.isfinite(data["actor/pg_loss"]) and data["timing_s/update_actor"] > 0
    assert any(key.startswith("val-core/") for key in by_step[0])  # validation generated through two_turn too


def test_dict_config_wrap_and_data_config_name_reach_the_loop(assets):
    from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop

    config = trainer_config(assets.model_path)

    async def build():
        loop = SingleTurnAgentLoop(
            trainer_config=DictConfigWrap(config),
            server_manager=None,
            tokenizer=hf_tokenizer(assets.model_path),
            processor=None,
            dataset_cls=None,
            data_config=DictConfigWrap(config.data),
        )
        ids = await loop.apply_chat_template([{"role": "user", "content": "What is 1 + 1?"}])
        return loop, ids

    loop, ids = asyncio.run(build())
    assert loop.config is config and loop.data_config.max_prompt_length == PROMPT_LEN
    assert loop.response_length == RESPONSE_LEN
    assert ids == hf_tokenizer(assets.model_path).apply_chat_template(
        [{"role": "user", "content": "What is 1 + 1?"}], add_generation_prompt=True, tokenize=True, return_dict=False
    )
