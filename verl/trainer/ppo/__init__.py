"""The PPO trainer (driver side). The algorithms live in :mod:`verl.algorithms`; their veRL paths here
(``verl.trainer.ppo.core_algos``, ``.kl``, ``.rollout_corr_helper``, ...) are those very modules."""
