"""The config folder is laid out as veRL's (Hydra groups), composes to the dataclass-generated config, accepts
``_target_`` keys, group overrides and recipe yamls, and a recipe's own keys (but not typos of base keys)."""

from __future__ import annotations

import importlib
import importlib.util
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from tests.trainer.config.test_validate import VALID
from verl.base_config import omega_conf_to_dataclass
from verl.trainer.config.schema import edit_distance, extend_schema
from verl.trainer.config.validate import ConfigError, base_config, merged, validate_config
from verl.workers.config import FSDPActorConfig
from verl.workers.config.builders import build_actor_config, build_rollout_config

ROOT = Path(__file__).resolve().parents[3]
CONFIG_DIR = ROOT / "verl" / "trainer" / "config"


def _generator():
    spec = importlib.util.spec_from_file_location(
        "generate_trainer_config", ROOT / "scripts" / "generate_trainer_config.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _targets(node: Any, prefix: str = "") -> list[tuple[str, str]]:
    if not isinstance(node, dict):
        return []
    out = [(prefix or "<root>", node["_target_"])] if "_target_" in node else []
    for key, value in node.items():
        out += _targets(value, f"{prefix}.{key}" if prefix else key)
    return out


def test_veRLs_groups_and_defaults_list():
    for rel in (
        "actor/actor.yaml",
        "actor/dp_actor.yaml",
        "actor/megatron_actor.yaml",
        "critic/dp_critic.yaml",
        "ref/dp_ref.yaml",
        "rollout/rollout.yaml",
        "model/hf_model.yaml",
        "data/legacy_data.yaml",
        "reward_model/dp_reward_model.yaml",
        "algorithm/rollout_correction.yaml",
        "engine/fsdp.yaml",
        "optim/fsdp.yaml",
        "ppo_megatron_trainer.yaml",
        "model_engine/dp.yaml",
        "model_engine/megatron.yaml",
    ):
        assert (CONFIG_DIR / rel).is_file(), rel
    defaults = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "ppo_trainer.yaml").defaults)
    # veRL 0.10: the model_engine group (dp | megatron) picks each role's file
    assert defaults[0] == {"model_engine": "dp"} and defaults[-1] == "_self_"
    assert {"actor@actor_rollout_ref.actor": "${model_engine}_actor"} in defaults
    assert {"algorithm@algorithm.rollout_correction": "rollout_correction"} in defaults


def test_the_composed_config_is_the_dataclass_generated_one():
    composed = OmegaConf.to_container(base_config(), resolve=False)
    assert composed == _generator().expected()


def test_every_target_names_our_class():
    for where, target in _targets(OmegaConf.to_container(base_config(), resolve=False)):
        module, _, name = target.rpartition(".")
        assert hasattr(importlib.import_module(module), name), f"{where}._target_={target} does not import"


def test_targets_are_ignored_when_building():
    cfg = OmegaConf.create(OmegaConf.to_container(merged(VALID), resolve=True))
    assert isinstance(omega_conf_to_dataclass(cfg.actor_rollout_ref.actor), FSDPActorConfig)  # by its _target_
    actor = build_actor_config(cfg.actor_rollout_ref.actor, rollout_n=2, dp_size=2)
    assert actor.optim.lr == 1e-6 and actor.policy_loss.loss_mode == "vanilla"
    assert build_rollout_config(cfg.actor_rollout_ref.rollout).val_kwargs.temperature == 0


def test_group_overrides_compose():
    config = merged(["actor@actor_rollout_ref.actor=dp_actor", *VALID])
    validate_config(config, check_environment=False)
    megatron = merged(["actor@actor_rollout_ref.actor=megatron_actor"])
    assert megatron.actor_rollout_ref.actor.strategy == "megatron" and "megatron" in megatron.actor_rollout_ref.actor


def test_the_megatron_trainer_composes_and_validates():
    # veRL's deprecated alias: ppo_trainer with model_engine=megatron (the ref's layout follows the actor's)
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        tp2 = "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2"
        config = compose("ppo_megatron_trainer", overrides=[*VALID, tp2])
        same = compose("ppo_trainer", overrides=[*VALID, "model_engine=megatron", tp2])
    assert config == same
    assert config.model_engine == "megatron" and config.critic.strategy == "megatron"
    assert config.actor_rollout_ref.ref.megatron.forward_only is True
    assert config.actor_rollout_ref.ref.megatron.tensor_model_parallel_size == 2
    validate_config(config, check_environment=False)


RECIPE = """\
hydra:
  searchpath:
    - {searchpath}
defaults:
  - ppo_trainer
  - _self_
my_recipe:
  alpha: 1
trainer:
  my_flag: true
actor_rollout_ref:
  actor:
    clip_ratio: 0.3
{extra}"""


def _compose_recipe(tmp_path: Path, searchpath: str, overrides: list[str], extra: str = ""):
    (tmp_path / "my_recipe.yaml").write_text(RECIPE.format(searchpath=searchpath, extra=extra))
    with initialize_config_dir(config_dir=str(tmp_path), version_base=None):
        return compose("my_recipe", overrides=overrides)


@pytest.mark.parametrize("searchpath", ["pkg://verl.trainer.config", "file://verl/trainer/config"])
def test_a_recipe_yaml_composes_and_its_keys_validate(tmp_path, monkeypatch, searchpath):
    monkeypatch.chdir(ROOT)  # veRL's file:// search path is relative to a checkout
    config = _compose_recipe(tmp_path, searchpath, VALID)
    assert config.my_recipe.alpha == 1 and config.actor_rollout_ref.actor.clip_ratio == 0.3
    assert config.actor_rollout_ref.actor._target_ == "verl.workers.config.FSDPActorConfig"
    schema, problems = extend_schema(base_config(), config)
    assert not problems
    validate_config(config, check_environment=False, schema=schema)
    with pytest.raises(ConfigError, match="unknown key 'my_recipe'"):
        validate_config(config, check_environment=False)  # against the base alone


def test_a_typo_in_the_recipe_yaml_or_on_the_command_line_names_the_key(tmp_path):
    extra = "    clip_ratoi: 0.25\n"
    config = _compose_recipe(tmp_path, "pkg://verl.trainer.config", VALID, extra=extra)
    _, problems = extend_schema(base_config(), config, where="my_recipe.yaml")
    assert (
        len(problems) == 1
        and "unknown key 'actor_rollout_ref.actor.clip_ratoi' declared in my_recipe.yaml" in (problems[0])
    )
    assert "did you mean 'actor_rollout_ref.actor.clip_ratio'" in problems[0]
    recipe = _compose_recipe(tmp_path, "pkg://verl.trainer.config", VALID)
    schema, _ = extend_schema(base_config(), recipe)
    OmegaConf.set_struct(recipe, False)  # as a command line's +trainer.total_epoch=3 would add it
    typo = OmegaConf.merge(recipe, OmegaConf.from_dotlist(["trainer.total_epoch=3"]))
    with pytest.raises(ConfigError, match="unknown key 'trainer.total_epoch'"):
        validate_config(typo, check_environment=False, schema=schema)
    assert edit_distance("total_epoch", "total_epochs") == 1


def test_base_config_works_inside_a_running_hydra_app(tmp_path):
    (tmp_path / "other.yaml").write_text("x: 1\n")
    with initialize_config_dir(config_dir=str(tmp_path), version_base=None):
        hydra_before = GlobalHydra.instance().hydra
        assert base_config(["trainer.total_epochs=2"]).trainer.total_epochs == 2
        assert GlobalHydra.instance().hydra is hydra_before
        assert compose("other").x == 1  # the app's own search path is back


APP = """\
import logging
import hydra
from verl.trainer.config.validate import validate_config

@hydra.main(config_path=".", config_name="my_recipe", version_base=None)
def main(config):
    validate_config(config, check_environment=False)  # the schema: the base + what my_recipe.yaml declares
    print("VALID", config.my_recipe.alpha)

if __name__ == "__main__":
    main()
"""


def test_a_real_hydra_app_validates_its_recipe_keys(tmp_path):
    (tmp_path / "my_recipe.yaml").write_text(RECIPE.format(searchpath="pkg://verl.trainer.config", extra=""))
    (tmp_path / "my_app.py").write_text(APP)
    args = [sys.executable, "my_app.py", "hydra.run.dir=.", "hydra.output_subdir=null", *VALID]
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    proc = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0 and "VALID 1" in proc.stdout, proc.stderr[-3000:]
    bad = subprocess.run([*args, "+trainer.total_epoch=3"], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert bad.returncode != 0 and "unknown key 'trainer.total_epoch'" in bad.stderr


def test_a_full_verl_style_yaml_validates_with_only_warnings(tmp_path, caplog):
    full = OmegaConf.to_container(base_config(), resolve=False)
    # veRL's own _target_ nodes that ours leave untyped
    full["global_profiler"]["_target_"] = "verl.utils.profiler.ProfilerConfig"
    full["actor_rollout_ref"]["actor"]["profiler"] = {"_target_": "verl.utils.profiler.ProfilerConfig"}
    full["critic"]["checkpoint"]["_target_"] = "verl.trainer.config.CheckpointConfig"
    path = tmp_path / "verl_style.yaml"
    path.write_text(OmegaConf.to_yaml(OmegaConf.create(full)))
    config = OmegaConf.merge(
        OmegaConf.load(path), OmegaConf.from_dotlist([*VALID, "actor_rollout_ref.actor.entropy_checkpointing=true"])
    )
    with caplog.at_level(logging.WARNING):
        validate_config(config, check_environment=False)
    assert "actor_rollout_ref.actor.entropy_checkpointing=True has no effect here" in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
