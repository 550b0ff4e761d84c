"""DAPO (Yu et al., 2025, arXiv:2503.14476) as a recipe: ``python -m recipe.dapo.main_dapo [key=value ...]``.

DAPO = GRPO with decoupled clipping (``clip_ratio_high`` 0.28 > ``clip_ratio_low`` 0.2), token-level loss
aggregation, dynamic sampling (``algorithm.filter_groups``, built into the trainer), the soft overlong punishment
(the ``dapo`` reward manager's ``reward_model.overlong_buffer``) and no KL term. See README.md here.
"""
