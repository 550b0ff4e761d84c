"""veRL 0.10's server classes over ours: the balancer alone, the clients' merging on scripted servers, and the real
thing — 2 hybrid workers (FSDP2 on gloo + the hf engine, the demo model) behind ``LLMServerManager``, its clients
and ``AgentLoopManager.create``."""

from __future__ import annotations

import asyncio
import time

import pytest
import ray
import torch
from omegaconf import OmegaConf

from tests.experimental.test_agent_loop import assets, engine_progress, prompt_batch, trainer_config  # noqa: F401
from verl.experimental.agent_loop import AgentLoopManager
from verl.experimental.agent_loop.server_manager import SampleClient, ServerHandle
from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
from verl.single_controller.ray.base import create_colocated_worker_cls
from verl.utils.tokenizer import hf_tokenizer
from verl.workers.fsdp_workers import ActorRolloutRefWorker
from verl.workers.rollout.llm_server import (
    FullyAsyncLLMServerClient,
    GlobalRequestLoadBalancer,
    LLMServerClient,
    LLMServerManager,
    ServerReplica,
)
from verl.workers.rollout.replica import TokenOutput

VERSION = 4  # the weight version the fixture's servers hold (one push named so)
LONG = {"max_tokens": 400, "ignore_eos": True, "temperature": 0.0}


# ---------------------------------------------------------------------------------------------- the balancer alone
def test_new_requests_go_to_the_least_loaded_server_and_conversations_stick():
    balancer = GlobalRequestLoadBalancer({"s0": "h0", "s1": "h1", "s2": "h2"})
    assert [balancer.acquire_server(r)[0] for r in ("a", "b", "c")] == ["s0", "s1", "s2"]  # ties: first registered
    assert balancer.acquire_server("d") == ("s0", "h0")  # all at 1: the first again
    balancer.release_server("s1")
    balancer.release_server("s2")
    assert balancer.acquire_server("a")[0] == "s0"  # a's next turn stays on s0 (load 3) although s1, s2 hold 0
    assert balancer.get_status()["servers"] == {"s0": 3, "s1": 0, "s2": 0}
    assert balancer.acquire_server("e")[0] == "s1" and balancer.get_total_inflight() == 4
    balancer.release_server("nobody")  # unknown: ignored
    for _ in range(5):
        balancer.release_server("s2")  # never below zero
    assert balancer.get_inflight_count("s2") == 0


def test_the_sticky_cache_forgets_the_least_recently_used_and_follows_removed_servers():
    balancer = GlobalRequestLoadBalancer({"s0": "h0", "s1": "h1"}, max_cache_size=2)
    balancer.acquire_server("a")  # s0 (loads 1, 0)
    balancer.acquire_server("b")  # s1 (1, 1)
    balancer.acquire_server("a")  # s0 (2, 1); b is now the least recently used id
    balancer.acquire_server("c")  # s1, the least loaded (2, 2); a third id: b is forgotten
    balancer.release_server("s0")
    balancer.release_server("s0")  # (0, 2)
    assert balancer.acquire_server("c")[0] == "s1"  # remembered, although s0 is less loaded (0, 3)
    assert balancer.acquire_server("b")[0] == "s0"  # forgotten: the least loaded, not its old s1 (1, 3); a goes
    balancer.remove_servers(["s1"])
    assert balancer.acquire_server("c") == ("s0", "h0")  # its server is gone: re-routed (2)
    balancer.add_servers({"s2": "h2"})
    assert balancer.acquire_server("c")[0] == "s0"  # pinned to s0 now, although s2 is idle (3)
    assert balancer.clear_sticky_cache() == {"cleared_entries": 2, "server_loads": {"s0": 3, "s2": 0}}
    assert balancer.acquire_server("c")[0] == "s2"  # cache cleared: the least loaded
    assert balancer.get_all_servers() == ["s0", "s2"] and balancer.get_server_handles() == {"s0": "h0", "s2": "h2"}
    balancer.remove_servers(["s0", "s2"])
    with pytest.raises(RuntimeError, match="No available servers in load balancer"):
        balancer.acquire_server("a")
    with pytest.raises(ValueError, match="max_cache_size=0 must be a positive int"):
        GlobalRequestLoadBalancer({}, max_cache_size=0)


def test_full_determinism_routes_by_a_stable_hash_whatever_the_load():
    servers = {f"s{i}": i for i in range(4)}
    first, second = GlobalRequestLoadBalancer(servers, full_determinism=True), GlobalRequestLoadBalancer(servers)
    ids = [f"req-{i}" for i in range(40)]
    routed = [first.acquire_server(r)[0] for r in ids]
    again = GlobalRequestLoadBalancer(servers, full_determinism=True)
    for _ in range(7):
        again.acquire_server("busy")  # load on one server changes nothing
    assert [again.acquire_server(r)[0] for r in ids] == routed  # a new instance (as in another run) agrees
    assert len(set(routed)) == 4
    assert [second.acquire_server(r)[0] for r in ids[:4]] == ["s0", "s1", "s2", "s3"]  # least loaded instead


# ---------------------------------------------------------------------------------------------- scripted servers
class ScriptedServer:
    """A server whose ``generate.remote`` returns the scripted outputs in turn and records each request."""

    def __init__(self, outputs: list[TokenOutput]) -> None:
        self.outputs, self.requests = list(outputs), []
        server = self

        class _Generate:
            async def remote(self, request_id, **kwargs):
                server.requests.append((request_id, kwargs))
                return server.outputs.pop(0)

        self.generate = _Generate()


def piece(tokens: list[int], version: int, stop: str) -> TokenOutput:
    return TokenOutput(
        token_ids=tokens,
        log_probs=[-0.5] * len(tokens),
        stop_reason=stop,
        num_preempted=1,
        extra_fields={"finish_reason": "abort" if stop == "aborted" else "stop", "global_steps": version},
        weight_versions=[version] * len(tokens),
    )


def test_fully_async_client_resends_an_aborted_request_for_the_rest_of_the_budget():
    # response_length 10 pins the budget: 4 tokens come back aborted at version 1, the resend asks for the other 6
    # with the 4 appended to the prompt and gets them at version 2; the merged output spans versions 1..2
    server = ScriptedServer([piece([5, 6, 7, 8], 1, "aborted"), piece([9, 10, 11, 12, 13, 14], 2, "completed")])
    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"response_length": 10}}})
    client = FullyAsyncLLMServerClient(config, GlobalRequestLoadBalancer({"s": server}))
    client.retry_delay_s = 0.0
    params = {"temperature": 1.0, "seed": 3}

    recording = SampleClient(client)  # what an agent loop is given
    out = asyncio.run(recording.generate("conv", prompt_ids=[1, 2], sampling_params=params))
    versions = recording.token_versions
    assert out.token_ids == list(range(5, 15)) and out.log_probs == [-0.5] * 10 and out.stop_reason == "completed"
    assert out.weight_versions == [1] * 4 + [2] * 6 and versions == out.weight_versions
    assert (out.extra_fields["min_global_steps"], out.extra_fields["max_global_steps"]) == (1, 2)
    assert out.extra_fields["global_steps"] == 2 and out.num_preempted == 2
    (first_id, first), (second_id, second) = server.requests
    assert (first_id, second_id) == ("conv/0", "conv/1")  # a server-side id per attempt
    assert first["prompt_ids"] == [1, 2] and second["prompt_ids"] == [1, 2, 5, 6, 7, 8]
    assert first["sampling_params"]["max_tokens"] == 10 and second["sampling_params"]["max_tokens"] == 6
    assert first["sampling_params"]["seed"] == 3 != second["sampling_params"]["seed"]  # a fresh stream per attempt
    assert params == {"temperature": 1.0, "seed": 3}  # the caller's dict is left alone


def test_fully_async_client_stops_at_the_budget_and_obeys_partial_rollout_false():
    # the first piece used the whole budget (max_tokens 4) before it was aborted: complete, nothing resent
    server = ScriptedServer([piece([5, 6, 7, 8], 3, "aborted")])
    client = FullyAsyncLLMServerClient({}, GlobalRequestLoadBalancer({"s": server}))
    out = asyncio.run(client.generate("c", prompt_ids=[1], sampling_params={"max_tokens": 4}))
    assert out.stop_reason == "completed" and out.extra_fields["finish_reason"] == "length"
    assert len(server.requests) == 1
    # async_training.partial_rollout=false (our trainer config's default): an aborted request comes back aborted
    server = ScriptedServer([piece([5], 3, "aborted")])
    config = OmegaConf.create({"async_training": {"partial_rollout": False}})
    client = FullyAsyncLLMServerClient(config, GlobalRequestLoadBalancer({"s": server}))
    out = asyncio.run(client.generate("c", prompt_ids=[1], sampling_params={"max_tokens": 4}))
    assert out.stop_reason == "aborted" and out.token_ids == [5] and len(server.requests) == 1


def test_only_hybrid_waits_for_a_server_and_the_plain_client_fails_at_once():
    server = ScriptedServer([piece([5], 0, "completed")])
    balancer = GlobalRequestLoadBalancer({})

    async def arrives_later():
        client = FullyAsyncLLMServerClient({}, balancer, only_hybrid=True)
        client.retry_delay_s = 0.01
        task = asyncio.create_task(client.generate("c", prompt_ids=[1], sampling_params={"max_tokens": 1}))
        await asyncio.sleep(0.05)
        assert not task.done()  # waiting for a server
        balancer.add_servers({"s": server})
        return await task

    assert asyncio.run(arrives_later()).token_ids == [5]
    plain = LLMServerClient({}, GlobalRequestLoadBalancer({}))
    with pytest.raises(RuntimeError, match="No available servers"):
        asyncio.run(plain.generate("c", prompt_ids=[1], sampling_params={}))


def test_client_errors_name_the_request():
    client = LLMServerClient({}, GlobalRequestLoadBalancer({"s": ScriptedServer([])}))
    with pytest.raises(TypeError, match=r"generate\('r'\): unexpected arguments \['beam'\]"):
        asyncio.run(client.generate("r", prompt_ids=[1], sampling_params={}, beam=2))
    with pytest.raises(NotImplementedError, match=r"generate\('r'\): audio_data / mm_processor_kwargs"):
        asyncio.run(client.generate("r", prompt_ids=[1], sampling_params={}, audio_data=[b"x"]))
    with pytest.raises(ValueError, match=r"generate\('r'\): prompt_ids"):
        asyncio.run(client.generate("r", prompt_ids="text", sampling_params={}))
    with pytest.raises(RuntimeError, match="no load balancer; get a client from LLMServerManager.get_client"):
        asyncio.run(LLMServerClient({}).generate("r", prompt_ids=[1], sampling_params={}))
    with pytest.raises(NotImplementedError, match="launching standalone rollout servers here is not supported"):
        LLMServerManager.create({}, worker_group=None)
    with pytest.raises(TypeError, match="must be a GlobalRequestLoadBalancer subclass"):
        LLMServerManager({}, worker_group=object(), load_balancer_cls=dict)


# ---------------------------------------------------------------------------------------------- the real servers
@pytest.fixture(scope="module")
def servers(ray_cluster, assets):  # noqa: F811
    """2 fused actor_rollout workers (as the trainer builds them) holding weight version ``VERSION``, and an
    ``LLMServerManager`` over them."""
    config = trainer_config(assets.model_path)
    pool = RayResourcePool([2], use_gpu=False, max_colocate_count=1)
    cls = RayClassWithInitArgs(ActorRolloutRefWorker, config=config.actor_rollout_ref, role="actor_rollout")
    fused = create_colocated_worker_cls({"actor_rollout": cls})
    wg = RayWorkerGroup(pool, fused, name_prefix="llmserver_").spawn(["actor_rollout"])["actor_rollout"]
    wg.init_model()
    wg.update_weights(version=VERSION)
    manager = LLMServerManager.create(config, worker_group=wg)
    yield config, wg, manager
    wg.shutdown()
    pool.release()


def a_prompt(assets) -> list[int]:  # noqa: F811
    return list(prompt_batch(assets, rows=1).non_tensor_batch["raw_prompt_ids"][0])


def load(manager: LLMServerManager) -> dict:
    return ray.get(manager.global_load_balancer.get_status.remote())


def settled(manager: LLMServerManager, timeout: float = 10) -> bool:
    """Whether every request released its server (releases are sent without waiting for them)."""
    deadline = time.monotonic() + timeout
    while load(manager)["total_inflight"] and time.monotonic() < deadline:
        time.sleep(0.01)
    return load(manager)["total_inflight"] == 0


async def until(condition, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not await condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def test_the_manager_wraps_each_worker_as_a_replica(servers):
    config, wg, manager = servers
    replicas = manager.get_replicas()
    assert [r.replica_rank for r in replicas] == [0, 1] and [r.worker_rank for r in replicas] == [0, 1]
    assert manager.get_addresses() == ["llmserver_actor_rollout:0", "llmserver_actor_rollout:1"]
    assert all(isinstance(r.server_handle, ServerHandle) for r in replicas)
    assert [r.workers for r in replicas] == [[wg.workers[0]], [wg.workers[1]]]
    assert load(manager)["servers"] == {address: 0 for address in manager.get_addresses()}
    assert type(manager.get_client()) is LLMServerClient
    assert len(manager.get_client().server_handles()) == 2

    class LastServer(GlobalRequestLoadBalancer):  # veRL's extension point: routing of one's own
        def acquire_server(self, request_id):
            server_id = list(self._servers)[-1]
            self._inflight[server_id] += 1
            return server_id, self._servers[server_id]

    async def build():  # create() awaited in a coroutine, as veRL's async callers do
        return await LLMServerManager.create(config, worker_group=wg, start_rank=5, load_balancer_cls=LastServer)

    other = asyncio.run(build())
    assert [r.replica_rank for r in other.get_replicas()] == [5, 6]
    assert ray.get(other.global_load_balancer.acquire_server.remote("x"))[0] == "llmserver_actor_rollout:1"
    with pytest.raises(NotImplementedError, match="KV cache only together with the weights"):
        asyncio.run(replicas[0].release_kv_cache())


def test_the_client_generates_on_the_engines_and_reports_the_weight_versions(servers, assets):  # noqa: F811
    _, wg, manager = servers
    prompt = a_prompt(assets)
    greedy = {"max_tokens": 24, "temperature": 0.0}

    recording = SampleClient(manager.get_client())
    output = asyncio.run(recording.generate("one", prompt_ids=prompt, sampling_params=greedy, priority=3))
    versions = recording.token_versions
    handle = ServerHandle(wg.workers[1], wg.method_prefix)
    direct = ray.get(handle.generate.remote("d", prompt_ids=prompt, sampling_params=greedy))
    assert output.token_ids == direct.token_ids and len(output.token_ids) > 0  # the engine's own tokens
    assert output.weight_versions == [VERSION] * len(output.token_ids) == versions
    fields = output.extra_fields
    assert fields["global_steps"] == fields["min_global_steps"] == fields["max_global_steps"] == VERSION


def test_requests_spread_over_the_servers_and_a_conversation_stays_on_its_own(servers, assets):  # noqa: F811
    _, wg, manager = servers
    prompt, (s0, s1) = a_prompt(assets), manager.get_addresses()

    async def scenario():
        client = manager.get_client()

        def start(conversation: str) -> asyncio.Task:
            return asyncio.create_task(client.generate(conversation, prompt_ids=prompt, sampling_params=LONG))

        async def loads(expected: dict) -> bool:
            return load(manager)["servers"] == expected

        first = [start("a"), start("b")]
        await until(lambda: loads({s0: 1, s1: 1}))  # a, b: one each (a on s0, the first registered)
        again = start("b")  # least loaded would say s0; b's conversation is on s1
        await until(lambda: loads({s0: 1, s1: 2}))

        async def b_turn_generating_on_rank_1() -> bool:
            return bool(await engine_progress(wg, 1, "b/1"))

        await until(b_turn_generating_on_rank_1)
        by_client = await client.abort(["a", "unknown"])  # the client's own conversations, by their ids
        aborted = await asyncio.gather(*(replica.abort_all_requests() for replica in manager.get_replicas()))
        outputs = await asyncio.gather(*first, again)
        await until(lambda: loads({s0: 0, s1: 0}))  # every request released its server
        return by_client, aborted, outputs

    by_client, aborted, outputs = asyncio.run(scenario())
    assert list(by_client) == ["a"] and by_client["a"].token_ids == outputs[0].token_ids  # its generate's output
    assert [sorted(a["request_ids"]) for a in aborted] == [[], ["b/0", "b/1"]]  # the rest, by the replicas
    assert [o.stop_reason for o in outputs] == ["aborted"] * 3 and all(0 < len(o.token_ids) < 400 for o in outputs)


def test_the_fully_async_client_makes_an_abort_invisible(servers, assets):  # noqa: F811
    """Greedy, aborted mid-way and resent with its tokens so far: the same tokens as uninterrupted."""
    _, wg, manager = servers
    prompt = a_prompt(assets)

    async def scenario():
        whole = await manager.get_client().generate("whole", prompt_ids=prompt, sampling_params=LONG)
        client = manager.get_client(client_cls=FullyAsyncLLMServerClient)
        client.retry_delay_s = 0.01
        task = asyncio.create_task(client.generate("cut", prompt_ids=prompt, sampling_params=LONG))

        async def generating() -> bool:
            progress = await asyncio.gather(*(engine_progress(wg, rank, "cut/0") for rank in (0, 1)))
            return any(p and p >= 5 for p in progress)

        await until(generating)
        aborted = await asyncio.gather(*(replica.abort_all_requests() for replica in manager.get_replicas()))
        return whole, await task, aborted

    whole, resumed, aborted = asyncio.run(scenario())
    assert sorted(sum((a["request_ids"] for a in aborted), [])) == ["cut/0"]  # it was cut while generating
    assert resumed.stop_reason == "completed" and resumed.token_ids == whole.token_ids
    torch.testing.assert_close(torch.tensor(resumed.log_probs), torch.tensor(whole.log_probs), atol=1e-4, rtol=0)
    assert resumed.weight_versions == [VERSION] * 400
    assert resumed.extra_fields["min_global_steps"] == resumed.extra_fields["max_global_steps"] == VERSION


def test_agent_loop_manager_create_generates_as_the_manager_over_the_worker_group(servers, assets):  # noqa: F811
    config, wg, manager = servers
    tokenizer = hf_tokenizer(assets.model_path)
    ours = AgentLoopManager(config, wg, tokenizer=tokenizer)
    verl_010 = AgentLoopManager.create(config, llm_client=manager.get_client(), tokenizer=tokenizer)
    assert verl_010.worker_group is None and len(verl_010.server_handles) == 2
    prompts = prompt_batch(assets)
    prompts.meta_info["global_steps"] = 3
    prompts.batch["prompt_index"] = torch.arange(len(prompts))
    batch = prompts.repeat(2, interleave=True)
    expected, got = ours.generate_sequences(batch), verl_010.generate_sequences(batch)
    for key in ("prompts", "responses", "attention_mask", "response_mask"):
        assert torch.equal(got.batch[key], expected.batch[key]), key  # the same seeded samples, bit for bit
    torch.testing.assert_close(got.batch["rollout_log_probs"], expected.batch["rollout_log_probs"], atol=1e-5, rtol=0)
    for key in ("min_global_steps", "max_global_steps"):
        assert list(got.non_tensor_batch[key]) == list(expected.non_tensor_batch[key]) == [VERSION] * len(batch), key
    assert settled(manager)
    with pytest.raises(RuntimeError, match=r"holds no worker group; use CheckpointEngineManager.sleep_replicas\(\)"):
        verl_010.sleep()


def test_agent_loop_manager_create_refuses_what_is_not_built(servers):
    config, _, manager = servers
    client = manager.get_client()
    with pytest.raises(ValueError, match=r"teacher clients for \['teacher'\] but the teachers' keys are \[\]"):
        AgentLoopManager.create(config, llm_client=client, teacher_client={"teacher": client})  # distillation off
    with pytest.raises(NotImplementedError, match="veRL's reward-loop worker processes have no counterpart here"):
        AgentLoopManager.create(config, llm_client=client, reward_loop_worker_handles=[])
    with pytest.raises(ValueError, match="AgentLoopManager.create needs llm_client"):
        AgentLoopManager.create(config)
    with pytest.raises(NotImplementedError, match="or an llm_client"):
        AgentLoopManager(config)


def test_a_replica_honours_free_cache_engine_false(servers):
    _, wg, manager = servers  # the fixture's rollout.free_cache_engine is false: sleep leaves the engine awake
    replica = manager.get_replicas()[0]
    assert isinstance(replica, ServerReplica) and not replica.config.free_cache_engine
    asyncio.run(replica.sleep())
    prompt = [5, 6, 7]
    out = ray.get(replica.server_handle.generate.remote("awake", prompt_ids=prompt, sampling_params={"max_tokens": 2}))
    assert len(out.token_ids) == 2
