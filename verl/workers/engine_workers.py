"""veRL 0.10's worker module: ``from verl.workers.engine_workers import ActorRolloutRefWorker, TrainingWorker``.

veRL 0.10 deleted its legacy ``fsdp_workers`` and runs every role on "engine workers". Here the FSDP2 engine
workers of `verl.workers.fsdp_workers` are those workers already, so this module names them:

- ``ActorRolloutRefWorker(config, role, distillation_config=None)``: the actor / rollout / reference worker
  (with ``distillation_config`` enabled, the actor's update adds the distillation term: the batch must carry
  ``teacher_logprobs`` / ``teacher_ids``);
- ``TrainingWorker``: the worker veRL 0.10's ``BaseTaskRunner.add_critic_worker`` maps ``Role.Critic`` to; here the
  critic worker, built from the ``critic`` config the trainer gives it.
"""

from __future__ import annotations

from verl.workers.fsdp_workers import ActorRolloutRefWorker, CriticWorker

TrainingWorker = CriticWorker

__all__ = ["ActorRolloutRefWorker", "TrainingWorker"]
