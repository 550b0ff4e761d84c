"""The CLI runs of the two async trainer modes, shared by their test modules (declared with ``@cli_run`` and
started by the session's scheduler, `tests/cli_runs.py`; the resumed runs start after the runs whose checkpoints
they read, ``after=``).

All runs train PPO with a critic (GAE) and a KL loss (the reference policy runs in the training workers: role
``actor_ref``) on 32 prompts of 16 for 3 steps, so they cross an epoch boundary; each dumps the samples it trains
(``trainer.rollout_data_dir``), which the sample-accounting checks read.

- ``sync``: the reference, one training worker.
- ``colocate_lag0`` / ``colocate_lag1`` (2 training workers + 2 resident servers, every push verified) /
  ``colocate_lag1_again`` (the same under ``trainer.v1.sampler.schedule=replay_buffer``) / ``colocate_resumed``
  (from ``colocate_lag1``'s step-1 checkpoint).
- ``separate_lag0`` / ``separate_lag1`` (1 training worker, a rollout pool of 2 servers, every push verified) /
  ``separate_lag1_again`` / ``separate_resumed`` (from ``separate_lag1``'s step-1 checkpoint).
- ``separate_partial``: partial rollout on two Ray nodes of this machine (``tests/trainer/ray_nodes.py``), the
  training worker placed on the node that offers ``train_pool``, the rollout server on the one that offers
  ``rollout_pool``; generation is made slower than training (one request at a time, 32 tokens each), so pushes
  land while the server generates. The nodes' resources are written to ``nodes.json`` in its folder.
- ``separate_killed``: as ``separate_lag1`` with slower generation; once step 1's checkpoint is saved, rollout server
  0 is killed (SIGKILL; its pid from the trainer's ``placement:`` log line), the moment written to ``killed_at``;
  the run must fail. ``separate_killed_resumed`` restarts it in the same folder with ``trainer.resume_mode=auto``.
- ``separate_lora``: as ``separate_lag1`` with a LoRA actor (``model.lora_rank=8``): adapter-only pushes.
- ``separate_buffer``: as ``separate_lag1`` under veRL 0.10's semantics (``trainer.v1.sampler.schedule=
  replay_buffer``): 16 prompts per step streamed in 2 mini-batches of 8 (``parameter_sync_step=2``), every push
  verified; ``separate_buffer_resumed`` from its step-1 checkpoint. ``separate_switch``: the same with veRL's hybrid
  switch (``hybrid_rollout.enable_switch``), no batch ahead and slow servers (one request at a time, 32 tokens).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.cli_runs import Prepared, cli_run
from tests.trainer.ray_nodes import two_nodes

COMMON = [
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32",
    "algorithm.adv_estimator=gae",
    "critic.ppo_micro_batch_size_per_gpu=32",
    "critic.model.fsdp_config.dtype=float32",
    "critic.optim.lr=1e-4",
    "actor_rollout_ref.actor.use_kl_loss=true",
    "data.train_max_samples=32",
    "trainer.total_epochs=3",
    "trainer.total_training_steps=3",
]
COLOCATE = [*COMMON, "trainer.mode=colocate_async", "trainer.save_freq=1", "trainer.n_gpus_per_node=2"]
SEPARATE = [
    *COMMON,
    "trainer.mode=separate_async",
    "actor_rollout_ref.hybrid_engine=false",  # as veRL's separate-pool scripts set it
    "rollout.n_gpus_per_node=2",  # the rollout pool: 2 servers; training: 1 worker
    "trainer.save_freq=1",
]
PARTIAL = [
    *COMMON,
    "trainer.mode=separate_async",
    "async_training.partial_rollout=true",
    "trainer.n_gpus_per_node=1",
    "trainer.custom_resources={train_pool: 1}",
    "rollout.custom_resources={rollout_pool: 1}",
    "data.max_response_length=32",
    "actor_rollout_ref.rollout.ignore_eos=true",
    "actor_rollout_ref.rollout.max_num_seqs=1",  # generation slower than training: pushes land mid-generation
]
BUFFER = [  # veRL 0.10's separate_async: the replay buffer, one warm-up batch, two mini-batches streamed per push
    *SEPARATE,
    "trainer.v1.sampler.schedule=replay_buffer",
    "actor_rollout_ref.actor.ppo_mini_batch_size=8",
    "trainer.v1.separate_async.parameter_sync_step=2",
]
VERIFIED = {"VERL_VERIFY_WEIGHT_SYNC": "1"}  # every push checked bit for bit in the servers
KILLED = [
    *SEPARATE,
    "data.max_response_length=32",
    "actor_rollout_ref.rollout.ignore_eos=true",
    "actor_rollout_ref.rollout.max_num_seqs=1",  # steps 2 and 3 take long enough to be cut short
]
PLACED = re.compile(r"role (\w+) rank (\d+): node \S+ \(id ([0-9a-f]{12})\), pid (\d+)")


def placed(output: str) -> dict[tuple[str, int], tuple[str, int]]:
    """(role, rank) → (node id prefix, pid), from the trainer's ``placement:`` log line."""
    return {(role, int(rank)): (node, int(pid)) for role, rank, node, pid in PLACED.findall(output)}


def kill_rollout_server_after_step_1(work: Path, timeout_s: float = 600) -> None:
    """Wait for step 1's checkpoint of the run in ``work``, then SIGKILL its rollout server 0; write the moment
    (``time.monotonic()``) to ``work / "killed_at"``."""
    deadline = time.monotonic() + timeout_s
    log = work / "output.log"
    while time.monotonic() < deadline:
        if (work / "ckpt" / "global_step_1").exists() and log.exists():
            server = placed(log.read_text(errors="replace")).get(("rollout", 0))
            if server is not None:
                os.kill(server[1], signal.SIGKILL)
                (work / "killed_at").write_text(repr(time.monotonic()))
                return
        time.sleep(0.1)


def dumped(work: Path) -> list[str]:
    return [f"trainer.rollout_data_dir={work / 'rollouts'}"]


def trained_samples(run) -> dict[int, list[tuple[str, str]]]:
    """The samples each step trained, as the run dumped them: step → sorted ``(prompt, ground truth)`` pairs."""
    out: dict[int, list[tuple[str, str]]] = {}
    for path in sorted((run.work / "rollouts").glob("*.jsonl")):
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        out[int(path.stem)] = sorted((row["input"], json.dumps(row["gts"])) for row in rows)
    return out


@cli_run("sync", cost_s=55)
def _sync(work: Path) -> Prepared:
    return [*COMMON, "trainer.mode=sync", *dumped(work)], {}


@cli_run("colocate_lag0", cost_s=65)
def _colocate_lag0(work: Path) -> Prepared:
    return [*COMMON, "trainer.mode=colocate_async", "async_training.max_lag=0"], {}


@cli_run("colocate_lag1", cost_s=80)
def _colocate_lag1(work: Path) -> Prepared:
    return COLOCATE, VERIFIED


@cli_run("colocate_lag1_again", cost_s=80)
def _colocate_lag1_again(work: Path) -> Prepared:
    """colocate_lag1 under veRL 0.10's replay-buffer schedule (one warm-up batch): it must train the same steps."""
    return [*COLOCATE, "trainer.v1.sampler.schedule=replay_buffer"], {}


@cli_run("separate_lag0", cost_s=65)
def _separate_lag0(work: Path) -> Prepared:
    """Written in veRL 0.10's keys: no batch generated ahead (the fixed lag 0), one optimizer step per push (16
    prompts per step, mini-batches of 16)."""
    v1 = ["trainer.v1.separate_async.num_warmup_batches=0", "trainer.v1.separate_async.parameter_sync_step=1"]
    return [*COMMON, "trainer.v1.trainer_mode=separate_async", *v1], {}


@cli_run("separate_lag1", cost_s=70)
def _separate_lag1(work: Path) -> Prepared:
    return [*SEPARATE, *dumped(work)], VERIFIED


@cli_run("separate_lora", cost_s=75)
def _separate_lora(work: Path) -> Prepared:
    """LoRA actor and reference in the training worker, adapters pushed over gloo to 2 servers, every push verified."""
    return [*SEPARATE, "actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.actor.optim.lr=1e-3"], VERIFIED


@cli_run("separate_killed", cost_s=90)
def _separate_killed(work: Path) -> Prepared:
    threading.Thread(target=kill_rollout_server_after_step_1, args=(work,), daemon=True).start()
    return [*KILLED, *dumped(work)], {}


@cli_run("separate_buffer", cost_s=65)
def _separate_buffer(work: Path) -> Prepared:
    return [*BUFFER, *dumped(work)], VERIFIED


@cli_run("separate_switch", cost_s=70)
def _separate_switch(work: Path) -> Prepared:
    """veRL's hybrid switch: no batch ahead and slow servers, so the trainer would wait; its engine is lent."""
    switch = [
        "trainer.v1.separate_async.hybrid_rollout.enable_switch=true",
        "trainer.v1.separate_async.num_warmup_batches=0",
        "data.max_response_length=32",
        "actor_rollout_ref.rollout.ignore_eos=true",
        "actor_rollout_ref.rollout.max_num_seqs=1",
    ]
    return [*BUFFER, *switch], VERIFIED


@cli_run("separate_lag1_again", cost_s=70)
def _separate_lag1_again(work: Path) -> Prepared:
    return SEPARATE, {}


def node_resources(address: str) -> dict[str, dict]:
    """Node id → resources of the Ray cluster at ``address`` (asked from a child process)."""
    code = (
        "import json, ray; ray.init(address=%r, log_to_driver=False); "
        "print(json.dumps({n['NodeID']: n['Resources'] for n in ray.nodes() if n['Alive']}))"
    )
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    out = subprocess.run([sys.executable, "-c", code % address], capture_output=True, text=True, env=env, timeout=60)
    return json.loads(out.stdout.strip().splitlines()[-1])


@cli_run("separate_partial", cost_s=110, own_cluster="two Ray nodes of its own, each offering one pool")
def _separate_partial(work: Path) -> Prepared:
    nodes = two_nodes(work)
    address = nodes.__enter__()
    (work / "nodes.json").write_text(json.dumps(node_resources(address)))
    stop = lambda: nodes.__exit__(None, None, None)  # noqa: E731 - the nodes outlive this call, not the run
    return Prepared([*PARTIAL, *dumped(work)], {"RAY_ADDRESS": address}, cleanup=stop)


def _resumed(run: str, args: list[str]):
    def prepare(work: Path, deps: dict) -> Prepared:
        checkpoint = deps[run].work / "ckpt" / "global_step_1"
        resume = ["trainer.resume_mode=resume_path", f"trainer.resume_from_path={checkpoint}"]
        return Prepared([*args, *resume, *dumped(work)], {})

    return prepare


cli_run("colocate_resumed", cost_s=60, after=("colocate_lag1",))(_resumed("colocate_lag1", COLOCATE))
cli_run("separate_resumed", cost_s=60, after=("separate_lag1",))(_resumed("separate_lag1", SEPARATE))
cli_run("separate_buffer_resumed", cost_s=60, after=("separate_buffer",))(_resumed("separate_buffer", BUFFER))


@cli_run("separate_killed_resumed", cost_s=70, after=("separate_killed",))
def _separate_killed_resumed(work: Path, deps: dict) -> Prepared:
    killed = deps["separate_killed"].work  # the same folders as the killed run (checkpoints, dumps); logs in its own
    overrides = [*KILLED, "trainer.resume_mode=auto", f"trainer.default_local_dir={killed / 'ckpt'}"]
    return Prepared([*overrides, *dumped(killed)], {})
