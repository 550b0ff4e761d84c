"""The driver side of verl: config schemas, algorithms (`ppo.core_algos`) and trainers."""
