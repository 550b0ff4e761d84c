"""veRL 0.10's ``CheckpointEngineManager`` over our push: 2 hybrid Ray workers (FSDP2 on gloo + the hf engine, tiny
Qwen2, every push verified bit for bit in the workers) behind ``LLMServerManager`` replicas; the staging path and
the shared ``push_weights`` on recording groups."""

from __future__ import annotations

import sys
import time
from types import SimpleNamespace

import pytest
import ray
from omegaconf import OmegaConf

from verl.checkpoint_engine import CheckpointEngineManager, push_weights
from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
from verl.trainer.ppo.rollout_manager import CheckpointManager
from verl.workers.config.rollout import CheckpointEngineConfig
from verl.workers.fsdp_workers import ActorRolloutRefWorker
from verl.workers.rollout.llm_server import LLMServerManager, ServerReplica

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the functions run in the workers

PROMPT = [5, 17, 42, 9, 77, 3]
GREEDY = {"max_tokens": 12, "temperature": 0.0, "ignore_eos": True}


def config(model_dir: str):
    return OmegaConf.create(
        {
            "actor_rollout_ref": {
                "model": {"path": model_dir, "enable_gradient_checkpointing": False, "use_remove_padding": False},
                "actor": {
                    "strategy": "fsdp2",
                    "ppo_mini_batch_size": 2,
                    "ppo_micro_batch_size_per_gpu": 1,
                    "fsdp_config": {"dtype": "float32"},
                    "use_kl_loss": False,
                },
                "rollout": {
                    "name": "hf",
                    "dtype": "float32",
                    "prompt_length": 8,
                    "response_length": 16,
                    "max_model_len": 1200,  # room for the long requests that get aborted
                    "log_prob_micro_batch_size_per_gpu": 2,
                    "free_cache_engine": True,
                },
            }
        }
    )


@pytest.fixture(scope="module")
def hybrid(ray_cluster, tiny_model_dir):
    """2 actor_rollout workers and the replicas of an ``LLMServerManager`` over them."""
    cfg = config(tiny_model_dir)
    pool = RayResourcePool([2], use_gpu=False, max_colocate_count=1)
    cls = RayClassWithInitArgs(ray.remote(ActorRolloutRefWorker), config=cfg.actor_rollout_ref, role="actor_rollout")
    wg = RayWorkerGroup(pool, cls, name_prefix="ckptmanager_")
    wg.set_weight_sync_verification(True)  # every push is checked against the actor's tensors, bit for bit
    wg.init_model()
    servers = LLMServerManager.create(cfg, worker_group=wg)
    yield wg, servers
    wg.shutdown()
    pool.release()


def manager(hybrid, backend: str = "naive") -> CheckpointEngineManager:
    wg, servers = hybrid
    return CheckpointEngineManager(CheckpointEngineConfig(backend=backend), wg, servers.get_replicas())


def generate(replica: ServerReplica, request_id: str, **params):
    return ray.get(
        replica.server_handle.generate.remote(request_id, prompt_ids=PROMPT, sampling_params={**GREEDY, **params})
    )


def _perturb(worker) -> None:
    """Load the engine's weights plus 0.05 (a push from somewhere else) as weight version 99."""
    engine = worker.rollout
    with engine.weight_update(99):
        engine.update_weights([(name, t + 0.05) for name, t in engine.named_weights()])


def test_a_push_loads_the_actor_weights_as_global_steps(hybrid):
    wg, servers = hybrid
    replicas = servers.get_replicas()
    ckpt = manager(hybrid)
    before = [generate(r, f"before-{r.replica_rank}") for r in replicas]
    digests = wg.rollout_named_weight_digests()
    ray.get([worker.__ray_call__.remote(_perturb) for worker in wg.workers])
    moved = [generate(r, f"moved-{r.replica_rank}") for r in replicas]
    assert all(m.token_ids != b.token_ids for m, b in zip(moved, before))  # the engines generate differently now
    assert wg.rollout_named_weight_digests() != digests and moved[0].extra_fields["global_steps"] == 99

    metrics = ckpt.update_weights(global_steps=12)  # veRL: the engines carry the step from now on
    assert metrics["weight_sync/tensors"] > 0 and metrics["weight_sync/bytes"] > 0
    assert wg.rollout_named_weight_digests() == digests  # the actor's weights again, in both engines
    after = [generate(r, f"after-{r.replica_rank}") for r in replicas]
    assert [a.token_ids for a in after] == [b.token_ids for b in before]
    assert all(a.weight_versions == [12] * len(a.token_ids) and a.extra_fields["global_steps"] == 12 for a in after)
    ckpt.update_weights()  # no step given: each engine's version + 1
    assert generate(replicas[0], "next").extra_fields["global_steps"] == 13


def test_sleep_wake_up_and_the_push_that_refills_the_engines(hybrid):
    _, servers = hybrid
    replica = servers.get_replicas()[1]
    ckpt = manager(hybrid)
    reference = generate(replica, "reference")
    ckpt.sleep_replicas()  # rollout.free_cache_engine: weights and KV cache freed
    with pytest.raises(Exception, match="the rollout engine is asleep"):
        generate(replica, "asleep")
    ckpt.wake_up_replicas()
    with pytest.raises(Exception, match="woken but never loaded"):  # the hf engine's memory is back, not its values
        generate(replica, "empty")
    ckpt.update_weights(global_steps=20)
    refilled = generate(replica, "refilled")
    assert refilled.token_ids == reference.token_ids and refilled.extra_fields["global_steps"] == 20


def test_abort_and_resume_generation(hybrid):
    wg, servers = hybrid
    replicas = servers.get_replicas()
    ckpt = manager(hybrid)
    long = {"max_tokens": 1000, "ignore_eos": True, "temperature": 1.0, "seed": 1}
    refs = [
        r.server_handle.generate.remote(f"long-{r.replica_rank}", prompt_ids=PROMPT, sampling_params=long)
        for r in replicas
    ]
    deadline = time.monotonic() + 30
    while not all(ray.get([w.__ray_call__.remote(_progress, f"long-{i}") for i, w in enumerate(wg.workers)])):
        assert time.monotonic() < deadline, "the requests never started"
        time.sleep(0.01)
    with pytest.raises(Exception, match=r"update_weights: \d+ generation request\(s\) are in flight"):
        ckpt.update_weights(global_steps=30)  # a hybrid push waits for idle engines: abort (or finish) first
    ckpt.abort_replicas()
    outputs = ray.get(refs)
    assert [o.stop_reason for o in outputs] == ["aborted"] * 2 and all(0 < len(o.token_ids) < 1000 for o in outputs)
    ckpt.resume_generation_replicas()  # nothing paused: a no-op
    assert generate(replicas[0], "served").stop_reason == "completed"
    ckpt.update_weights(global_steps=30)  # idle again: the push goes through


def _progress(worker, request_id: str) -> int | None:
    return worker.rollout.progress(request_id)


def test_what_cannot_work_here_is_refused_by_name(hybrid):
    wg, servers = hybrid
    replicas = servers.get_replicas()
    ckpt = manager(hybrid)
    with pytest.raises(NotImplementedError, match="release_kv_cache_replicas: our engines free the KV cache only"):
        ckpt.release_kv_cache_replicas()
    with pytest.raises(NotImplementedError, match="resume_kv_cache_replicas"):
        ckpt.resume_kv_cache_replicas()
    ckpt.remove_replicas([replicas[0]])
    assert ckpt.replicas == [replicas[1]]
    with pytest.raises(NotImplementedError, match=r"cover ranks \[1\] of the 2 training workers.*sleep together"):
        ckpt.sleep_replicas()
    ckpt.add_replicas([replicas[0]])
    ckpt.sleep_replicas()  # whole again
    ckpt.update_weights(global_steps=40)  # and refilled (the push wakes the engines' memory)
    assert generate(replicas[0], "back").extra_fields["global_steps"] == 40

    with pytest.raises(ValueError, match="unknown rollout.checkpoint_engine.backend 'nixl'"):
        manager(hybrid, "nixl")
    outside = ServerReplica(0, SimpleNamespace(workers=[object()], name_prefix="elsewhere"))
    with pytest.raises(
        ValueError, match=r"backend 'naive' loads weights into the training workers' own engines.*'shm'"
    ):
        CheckpointEngineManager({"backend": "naive"}, wg, [outside])
    with pytest.raises(TypeError, match="has no \\['worker_group', 'worker_rank'\\]"):
        CheckpointEngineManager({"backend": "naive"}, wg, [SimpleNamespace(workers=[wg.workers[0]])])
    with pytest.raises(TypeError, match="global_steps='3' must be an int or None"):
        ckpt.update_weights(global_steps="3")
    with pytest.raises(ImportError, match="no_such_backend_module"):
        CheckpointEngineManager({"backend": "naive", "custom_backend_module": "no_such_backend_module"}, wg, [])


# ---------------------------------------------------------------------------------------------- recording groups
class RecordingGroup:
    """A worker group whose calls are recorded: ``update_weights`` returns per-rank stats, a server group stages
    ``staged`` versions and applies what it is told."""

    def __init__(self, ranks: int, staged: list[int] | None = None) -> None:
        self.workers = [object() for _ in range(ranks)]
        self.name_prefix = "recording"
        self.staged, self.calls = staged, []

    def update_weights(self, version=None, to=None):
        self.calls.append(("update_weights", version) if to is None else ("update_weights", version, to))
        return [
            {"weight_sync/bytes": 10.0 * (rank + 1), "weight_sync/tensors": 4.0} for rank in range(len(self.workers))
        ]

    def execute_all_async(self, method):
        self.calls.append((method,))
        return [ray.put(v) for v in self.staged]

    def apply_weights(self, version, drop_older=True):
        self.calls.append(("apply_weights", version))
        return [version] * len(self.workers)


def test_push_weights_averages_the_ranks_and_checks_what_the_servers_staged(ray_cluster):
    actor = RecordingGroup(2)
    # bytes 10 and 20 on the two ranks: their mean
    assert push_weights(actor, 5) == {"weight_sync/bytes": 15.0, "weight_sync/tensors": 4.0}
    assert push_weights(actor, 6, RecordingGroup(2, staged=[6, 6]))["weight_sync/bytes"] == 15.0
    with pytest.raises(RuntimeError, match=r"weight push 7: the rollout servers staged versions \[7, 6\]"):
        push_weights(actor, 7, RecordingGroup(2, staged=[7, 6]))
    # the trainer's CheckpointManager pushes through it: one version up, the same metrics
    state = SimpleNamespace(weight_version=2)
    assert CheckpointManager(actor, state).update_weights() == {"weight_sync/bytes": 15.0, "weight_sync/tensors": 4.0}
    assert state.weight_version == 3 and actor.calls[-1] == ("update_weights", 3)


def test_servers_of_their_own_pool_stage_the_push_then_load_it(ray_cluster):
    actor, servers = RecordingGroup(2), RecordingGroup(2, staged=[8, 8])
    replicas = [ServerReplica(rank, servers) for rank in range(2)]
    ckpt = CheckpointEngineManager({"backend": "gloo"}, actor, replicas)
    assert ckpt.update_weights(global_steps=8) == {"weight_sync/bytes": 15.0, "weight_sync/tensors": 4.0}
    assert servers.calls == [("receive_weights",), ("apply_weights", 8)]
    assert actor.calls == [("update_weights", 8, "servers")]  # to the staging servers, not an engine of its own
    with pytest.raises(ValueError, match=r"servers that stage pushes \(backend 'gloo'\) load them by version"):
        ckpt.update_weights()
    CheckpointEngineManager({"backend": "shm"}, actor, replicas).update_weights(global_steps=9)
    assert servers.calls[-1] == ("apply_weights", 8)  # shm: the push itself loads them, no staging
    ckpt.sleep_replicas()  # servers of their own keep their memory: nothing is called
    assert len(servers.calls) == 2
    other = ServerReplica(0, RecordingGroup(1))
    with pytest.raises(NotImplementedError, match="replicas from 2 server groups"):
        ckpt.add_replicas([other])
