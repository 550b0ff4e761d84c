"""PPO-family algorithms and trainer. The public algorithm names live in `verl.trainer.ppo.core_algos`."""
