"""Interactions (veRL's ``verl.interactions``): simulated users that answer the model between its turns in a
multi-turn rollout (``multi_turn.interaction_config_path``)."""
