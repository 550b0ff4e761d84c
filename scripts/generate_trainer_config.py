"""Write the trainer config folder (verl/trainer/config) from the config dataclasses: their defaults are the source
of truth.

    python scripts/generate_trainer_config.py           # rewrite the YAML files
    python scripts/generate_trainer_config.py --check   # exit 1 if any YAML file is out of date (a test runs this)

The folder is laid out as veRL's: group folders (``actor/``, ``critic/``, ``data/``, ``engine/``, ``model/``,
``optim/``, ``ref/``, ``reward_model/``, ``rollout/``, ``algorithm/``) with veRL's file names, and
``ppo_trainer.yaml`` / ``ppo_megatron_trainer.yaml`` whose ``defaults:`` lists mount them at veRL's packages
(``actor@actor_rollout_ref.actor: dp_actor``, …). `expected` is the whole composed ``ppo_trainer`` config, built
from the dataclasses and the hand-written sections (``trainer_config_sections.py``); `files` cuts it into the group
files (a role's common file, its ``dp_*`` / ``megatron_*`` variants, the shared ``engine`` and ``optim`` files, a
role's file holding only what differs from the shared one). A test composes the folder with Hydra and checks it
equals `expected`. Nodes backed by a dataclass carry ``_target_`` (veRL's class paths, which are ours too).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import sys
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "scripts"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import trainer_config_sections as sections  # noqa: E402

from verl.algorithms.config import AlgoConfig, KLControlConfig, RolloutCorrectionConfig  # noqa: E402
from verl.trainer.config.async_training import AsyncTrainingConfig  # noqa: E402
from verl.trainer.config.schema import PLUS_KEYS  # noqa: E402
from verl.workers.config import (  # noqa: E402
    ActorConfig,
    AgentLoopConfig,
    CheckpointConfig,
    CheckpointEngineConfig,
    CriticConfig,
    CriticModelConfig,
    CustomAsyncServerConfig,
    FSDPEngineConfig,
    FSDPOptimizerConfig,
    HFModelConfig,
    McoreEngineConfig,
    MultiTurnConfig,
    PolicyLossConfig,
    PrometheusConfig,
    RefConfig,
    RoleProfilerConfig,
    RolloutConfig,
    SamplingConfig,
    TraceConfig,
)
from verl.workers.config.optimizer import role_optim_default  # noqa: E402

CONFIG_DIR = ROOT / "verl" / "trainer" / "config"

# Fields the worker fills in (never set by users): left out of the YAML.
INTERNAL_FIELDS = {"global_batch_info", "data_parallel_size"}
# veRL's keys that scripts add with ``+`` (the dataclass has them, veRL's YAML does not)
PLUS_FIELDS = {key.rsplit(".", 1)[1] for key in PLUS_KEYS}

_W = "verl.workers.config."
# ``_target_`` of the nodes a dataclass backs: veRL's class paths (each resolves to our class; a test checks it).
TARGETS: dict[type, str] = {
    HFModelConfig: _W + "HFModelConfig",
    FSDPOptimizerConfig: _W + "FSDPOptimizerConfig",
    FSDPEngineConfig: _W + "FSDPEngineConfig",
    McoreEngineConfig: _W + "McoreEngineConfig",
    PolicyLossConfig: _W + "PolicyLossConfig",
    CheckpointConfig: "verl.trainer.config.CheckpointConfig",
    RolloutConfig: _W + "RolloutConfig",
    SamplingConfig: _W + "SamplingConfig",
    MultiTurnConfig: _W + "MultiTurnConfig",
    AgentLoopConfig: _W + "AgentLoopConfig",
    CustomAsyncServerConfig: _W + "CustomAsyncServerConfig",
    CheckpointEngineConfig: _W + "CheckpointEngineConfig",
    TraceConfig: _W + "TraceConfig",
    PrometheusConfig: _W + "PrometheusConfig",
    CriticModelConfig: _W + "FSDPCriticModelCfg",
    AlgoConfig: "verl.trainer.config.AlgoConfig",
    KLControlConfig: "verl.trainer.config.KLControlConfig",
    RolloutCorrectionConfig: "verl.trainer.config.RolloutCorrectionConfig",
}
ROLE_TARGETS = {
    "actor": _W + "ActorConfig",
    "dp_actor": _W + "FSDPActorConfig",
    "megatron_actor": _W + "McoreActorConfig",
    "critic": _W + "CriticConfig",
    "dp_critic": _W + "FSDPCriticConfig",
    "megatron_critic": _W + "McoreCriticConfig",
    "megatron_ref": _W + "McoreRefConfig",
    "megatron_optim": _W + "McoreOptimizerConfig",
}

# The reference policy's Megatron keys that follow the actor's (veRL's megatron_ref.yaml): one layout per worker.
REF_FOLLOWS_ACTOR = (
    "seed",
    "override_transformer_config",
    "use_mbridge",
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "virtual_pipeline_model_parallel_size",
    "context_parallel_size",
    "sequence_parallel",
    "expert_model_parallel_size",
    "expert_tensor_parallel_size",
    "param_offload",
    "dtype",
)

# Keys of a role that belong to its strategy's file (dp_* / megatron_*), not to the role's common file.
DP_ACTOR_KEYS = ("strategy", "grad_clip", "ulysses_sequence_parallel_size", "use_remove_padding")
DP_ACTOR_KEYS += ("entropy_from_logits_with_chunking", "entropy_checkpointing")
DP_REF_KEYS = ("ulysses_sequence_parallel_size", "use_remove_padding")
DP_REF_KEYS += ("entropy_from_logits_with_chunking", "entropy_checkpointing")
DP_CRITIC_KEYS = ("strategy", "grad_clip", "ulysses_sequence_parallel_size")  # and fsdp, the engine block

# veRL's megatron optimizer keys beyond the shared ones (optim/megatron.yaml).
MEGATRON_OPTIM = {
    "optimizer": "adam",
    "lr_warmup_init": 0.0,
    "lr_decay_steps": None,
    "lr_decay_style": "constant",
    "min_lr": 0.0,
    "weight_decay_incr_style": "constant",
    "lr_wsd_decay_style": "exponential",
    "lr_wsd_decay_steps": None,
    "use_checkpoint_opt_param_scheduler": False,
}

HEADER = """\
# The PPO/GRPO trainer's config: veRL 0.10's layout, keys and defaults; veRL's older names (trainer.mode, the top-level
# rollout.nnodes/n_gpus_per_node, reward_model.* / reward_manager.* / custom_reward_function.*) are read into the
# newer ones with a warning (verl/trainer/config/layout.py). Generated by scripts/generate_trainer_config.py from the
# config dataclasses (do not edit; a test checks every file of this folder). The defaults list mounts the group files
# (actor/dp_actor.yaml at actor_rollout_ref.actor, ...); model_engine=megatron selects the Megatron-Core roles
# (megatron_actor, megatron_ref, megatron_critic), and any file can be selected as veRL does, e.g.
# actor@actor_rollout_ref.actor=dp_actor.
#
#   python -m verl.trainer.main_ppo                                   # the built-in CPU demo (GRPO, tiny model)
#   python -m verl.trainer.main_ppo data.train_files=... actor_rollout_ref.model.path=... [key=value ...]
#
# Ours, beyond veRL: trainer.device (auto|cpu|cuda), reward.timeout_s (per-sample reward timeout),
# actor_rollout_ref.rollout.seed (per-sample sampling seeds), data.filter_malformed_rows (drop malformed rows instead
# of failing), async_training.max_lag (the staleness bound in weight versions; veRL's other async_training keys are
# here with our defaults).
"""
GROUP_HEADER = "# Generated by scripts/generate_trainer_config.py (do not edit). {what}\n"
MEGATRON_NOTE = "Megatron variant (the Megatron-Core engine, verl/workers/engine/megatron_engine.py)."


def dump(config: Any) -> dict[str, Any]:
    """A dataclass's init fields as plain YAML values (nested dataclasses recursed with their ``_target_``, tuples
    as lists); veRL's ``+``-only keys (`PLUS_KEYS`) left out."""
    out: dict[str, Any] = {"_target_": TARGETS[type(config)]} if type(config) in TARGETS else {}
    for f in dataclasses.fields(config):
        if not f.init or f.name in INTERNAL_FIELDS or f.name in PLUS_FIELDS:
            continue
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            value = dump(value)
        elif isinstance(value, tuple):
            value = list(value)
        out[f.name] = copy.deepcopy(value)
    return out


def expected() -> dict[str, Any]:
    """The whole composed ``ppo_trainer`` config, with the cross-section links veRL writes as interpolations."""
    actor = {"_target_": ROLE_TARGETS["dp_actor"], **dump(ActorConfig())}
    actor["rollout_n"] = "${oc.select:actor_rollout_ref.rollout.n,1}"
    rollout = dump(RolloutConfig())
    rollout["prompt_length"] = "${data.max_prompt_length}"
    rollout["response_length"] = "${data.max_response_length}"
    rollout["n_gpus_per_node"] = "${trainer.n_gpus_per_node}"
    rollout["trace"]["project_name"] = "${oc.select:trainer.project_name,null}"
    rollout["trace"]["experiment_name"] = "${oc.select:trainer.experiment_name,null}"
    ref = dump(RefConfig())
    ref["strategy"] = "${actor_rollout_ref.actor.strategy}"
    ref["log_prob_micro_batch_size_per_gpu"] = (
        "${oc.select:actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu,null}"
    )
    ref["log_prob_use_dynamic_bsz"] = "${oc.select:actor_rollout_ref.rollout.log_prob_use_dynamic_bsz,false}"
    ref["log_prob_max_token_len_per_gpu"] = (
        "${oc.select:actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu,16384}"
    )
    critic = {"_target_": ROLE_TARGETS["dp_critic"], **dump(CriticConfig())}
    critic["rollout_n"] = "${oc.select:actor_rollout_ref.rollout.n,1}"
    critic["model"]["path"] = "${actor_rollout_ref.model.path}"
    for key in ("ppo_mini_batch_size", "ppo_epochs", "shuffle", "use_dynamic_bsz", "loss_agg_mode"):
        critic[key] = "${actor_rollout_ref.actor." + key + "}"
    critic["forward_micro_batch_size_per_gpu"] = "${critic.ppo_micro_batch_size_per_gpu}"
    critic["forward_max_token_len_per_gpu"] = "${critic.ppo_max_token_len_per_gpu}"
    reward_model = sections.reward_model()
    reward_model["profiler"] = dump(RoleProfilerConfig())
    for role in (actor, ref, rollout, critic, reward_model):  # a role's profiler follows global_profiler
        role["profiler"] = {"_target_": "verl.utils.profiler.ProfilerConfig", **role["profiler"]}
        role["profiler"]["tool"] = "${oc.select:global_profiler.tool,null}"
        role["profiler"]["save_path"] = "${oc.select:global_profiler.save_path,null}"
    return {
        "data": sections.data(),
        "actor_rollout_ref": {
            "hybrid_engine": True,
            "nccl_timeout": 600,
            "model": dump(HFModelConfig()),
            "actor": actor,
            "ref": ref,
            "rollout": rollout,
        },
        "critic": critic,
        "reward_model": reward_model,
        "reward": sections.reward(),
        "reward_manager": sections.reward_manager(),
        "custom_reward_function": sections.custom_reward_function(),
        "algorithm": dump(AlgoConfig()),
        "trainer": sections.trainer(),
        "async_training": dump(AsyncTrainingConfig()),
        "rollout": sections.rollout_pool(),
        "global_profiler": sections.global_profiler(),
        "transfer_queue": sections.transfer_queue(),
        "ray_kwargs": sections.ray_kwargs(),
        "model_engine": "dp",
        "skip": sections.skip(),
        "distillation": sections.distillation(),
    }


def diff(full: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """The part of ``full`` that ``base`` does not already give (mappings compared key by key)."""
    out = {}
    for key, value in full.items():
        if isinstance(value, dict) and value and isinstance(base.get(key), dict):
            sub = diff(value, base[key])
            if sub:
                out[key] = sub
        elif key not in base or base[key] != value:
            out[key] = value
    return out


def _pick(node: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    return {k: node[k] for k in keys if k in node}


def _drop(node: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    return {k: v for k, v in node.items() if k not in keys}


def _with(defaults: list[Any], body: dict[str, Any]) -> dict[str, Any]:
    return {"defaults": defaults, **body}


def _optim_diff(role: dict[str, Any], optim: dict[str, Any]) -> dict[str, Any]:
    return {"optim": d} if (d := diff(role["optim"], optim)) else {}


def files() -> dict[str, tuple[str, dict[str, Any]]]:
    """``{path relative to verl/trainer/config: (what it is, content)}`` for every generated file."""
    full = expected()
    arr = full["actor_rollout_ref"]
    actor, ref, critic, rm = arr["actor"], arr["ref"], full["critic"], full["reward_model"]
    engine, optim = dump(FSDPEngineConfig()), dump(role_optim_default())
    mcore = dump(McoreEngineConfig())
    optim_megatron = {**optim, "_target_": ROLE_TARGETS["megatron_optim"], **MEGATRON_OPTIM}
    dp_keys = DP_ACTOR_KEYS
    actor_common = {"_target_": ROLE_TARGETS["actor"], **_drop(actor, ("_target_", "optim", "fsdp_config", *dp_keys))}
    actor_common |= _optim_diff(actor, optim)
    fsdp_diff = {"fsdp_config": d} if (d := diff(actor["fsdp_config"], engine)) else {}
    ref_fsdp = {"fsdp_config": d} if (d := diff(ref["fsdp_config"], engine)) else {}
    critic_model = _drop(critic["model"], ("fsdp_config",))
    critic_fsdp = {"model": {"fsdp_config": d}} if (d := diff(critic["model"]["fsdp_config"], engine)) else {}
    if d := diff(critic["fsdp"], engine):
        critic_fsdp["fsdp"] = d
    critic_common = {"_target_": ROLE_TARGETS["critic"]}
    critic_common |= _drop(critic, ("_target_", "optim", "fsdp", *DP_CRITIC_KEYS)) | {"model": critic_model}
    critic_common |= _optim_diff(critic, optim)
    rm_common = _drop(rm, ("strategy",)) | {"model": _drop(rm["model"], ("fsdp_config",))}
    megatron_engine = {"../engine@megatron": "megatron"}
    dp_actor_defaults = [{"../optim@optim": "fsdp"}, {"../engine@fsdp_config": "fsdp"}, "actor", "_self_"]
    mg_defaults = [{"../optim@optim": "megatron"}, megatron_engine, "actor", "_self_"]
    algorithm = _drop(full["algorithm"], ("rollout_correction",))
    trainer_body = {
        "actor_rollout_ref": {"hybrid_engine": arr["hybrid_engine"], "nccl_timeout": arr["nccl_timeout"]},
        **{k: v for k, v in full.items() if k not in ("data", "actor_rollout_ref", "critic", "reward_model")},
        "algorithm": algorithm,
    }
    return {
        "engine/fsdp.yaml": ("The FSDP engine (a role's fsdp_config).", engine),
        "engine/megatron.yaml": ("The Megatron-Core engine (a role's megatron).", mcore),
        "optim/fsdp.yaml": ("The FSDP roles' optimizer.", optim),
        "optim/megatron.yaml": ("The Megatron roles' optimizer. " + MEGATRON_NOTE, optim_megatron),
        "model/hf_model.yaml": ("The policy's Hugging Face model.", dump(HFModelConfig())),
        "data/legacy_data.yaml": ("The RL dataset.", full["data"]),
        "rollout/rollout.yaml": ("The rollout (generation) role.", arr["rollout"]),
        "algorithm/rollout_correction.yaml": (
            "Rollout correction (algorithm.rollout_correction).",
            dump(RolloutCorrectionConfig()),
        ),
        "actor/actor.yaml": ("The actor's keys common to every strategy.", actor_common),
        "actor/dp_actor.yaml": (
            "The FSDP actor.",
            _with(dp_actor_defaults, {"_target_": actor["_target_"], **_pick(actor, dp_keys), **fsdp_diff}),
        ),
        "actor/megatron_actor.yaml": (
            MEGATRON_NOTE,
            _with(
                mg_defaults,
                {
                    "_target_": ROLE_TARGETS["megatron_actor"],
                    **_pick(actor, dp_keys),
                    "strategy": "megatron",
                    "load_weight": True,
                },
            ),
        ),
        "ref/ref.yaml": (
            "The reference policy's keys common to every strategy.",
            _drop(ref, ("fsdp_config", *DP_REF_KEYS)),
        ),
        "ref/dp_ref.yaml": (
            "The FSDP reference policy.",
            _with(["ref", {"../engine@fsdp_config": "fsdp"}, "_self_"], {**_pick(ref, DP_REF_KEYS), **ref_fsdp}),
        ),
        "ref/megatron_ref.yaml": (
            MEGATRON_NOTE,
            _with(
                ["ref", megatron_engine, "_self_"],
                {
                    "_target_": ROLE_TARGETS["megatron_ref"],
                    **_pick(ref, DP_REF_KEYS),
                    "load_weight": True,
                    "megatron": {
                        **{k: _follow_actor(k, mcore[k]) for k in REF_FOLLOWS_ACTOR},
                        "forward_only": True,
                    },
                },
            ),
        ),
        "critic/critic.yaml": ("The critic's keys common to every strategy.", critic_common),
        "critic/dp_critic.yaml": (
            "The FSDP critic.",
            _with(
                [
                    {"../optim@optim": "fsdp"},
                    {"../engine@fsdp": "fsdp"},
                    {"../engine@model.fsdp_config": "fsdp"},
                    "critic",
                    "_self_",
                ],
                {"_target_": critic["_target_"], **_pick(critic, DP_CRITIC_KEYS), **critic_fsdp},
            ),
        ),
        "critic/megatron_critic.yaml": (
            MEGATRON_NOTE,
            _with(
                [{"../optim@optim": "megatron"}, megatron_engine, "critic", "_self_"],
                {
                    "_target_": ROLE_TARGETS["megatron_critic"],
                    **_pick(critic, DP_CRITIC_KEYS),
                    "strategy": "megatron",
                    "load_weight": True,
                },
            ),
        ),
        "reward_model/reward_model.yaml": ("The reward model's keys common to every strategy.", rm_common),
        "reward_model/dp_reward_model.yaml": (
            "The FSDP reward model.",
            _with(
                ["reward_model", "_self_"],
                {"strategy": rm["strategy"], "model": {"fsdp_config": rm["model"]["fsdp_config"]}},
            ),
        ),
        "reward_model/megatron_reward_model.yaml": (
            MEGATRON_NOTE,
            _with(["reward_model", megatron_engine, "_self_"], {"strategy": "megatron", "load_weight": True}),
        ),
        "model_engine/dp.yaml": (
            "model_engine=dp: the FSDP roles (dp_actor, dp_ref, dp_critic, ...).",
            {"model_engine": "dp"},
        ),
        "model_engine/megatron.yaml": (
            "model_engine=megatron: the Megatron-Core roles (megatron_actor, megatron_ref, megatron_critic, ...).",
            {"model_engine": "megatron"},
        ),
        "ppo_trainer.yaml": ("", _with(trainer_defaults("dp"), _drop(trainer_body, ("model_engine",)))),
        "ppo_megatron_trainer.yaml": (
            "veRL's deprecated alias of ppo_trainer with model_engine=megatron.",
            _with(trainer_defaults("megatron"), _drop(trainer_body, ("model_engine",))),
        ),
    }


def _follow_actor(key: str, default: Any) -> str:
    text = (
        "{}"
        if default == {}
        else ("null" if default is None else str(default).lower() if isinstance(default, bool) else str(default))
    )
    return "${oc.select:actor_rollout_ref.actor.megatron." + key + "," + text + "}"


def trainer_defaults(engine: str) -> list[Any]:
    """The defaults list of ``ppo_trainer`` (model engine ``dp``) or ``ppo_megatron_trainer`` (``megatron``, veRL's
    deprecated alias): veRL 0.10's groups and packages; the ``model_engine`` group picks the role files."""
    return [
        {"model_engine": engine},
        {"actor@actor_rollout_ref.actor": "${model_engine}_actor"},
        {"data@data": "legacy_data"},
        {"ref@actor_rollout_ref.ref": "${model_engine}_ref"},
        {"rollout@actor_rollout_ref.rollout": "rollout"},
        {"model@actor_rollout_ref.model": "hf_model"},
        {"critic@critic": "${model_engine}_critic"},
        {"reward_model@reward_model": "${model_engine}_reward_model"},
        {"algorithm@algorithm.rollout_correction": "rollout_correction"},
        "_self_",
    ]


def render() -> dict[Path, str]:
    """``{absolute path: text}`` of every generated file."""
    out = {}
    for rel, (what, content) in files().items():
        head = HEADER if rel == "ppo_trainer.yaml" else GROUP_HEADER.format(what=what)
        if rel.startswith("model_engine/"):  # the group sets a top-level key
            head = "# @package _global_\n" + head
        out[CONFIG_DIR / rel] = head + "\n" + OmegaConf.to_yaml(OmegaConf.create(content), sort_keys=False)
    return out


# Hand-written primary configs of the other entry points (main_generation, main_eval, fsdp_sft_trainer): not
# generated, not stale.
HAND_WRITTEN = ("generation.yaml", "evaluation.yaml", "sft_trainer.yaml")


def stale(texts: dict[Path, str]) -> list[Path]:
    """YAML files of the folder that the generator does not write (left over from an older layout)."""
    hand_written = {CONFIG_DIR / name for name in HAND_WRITTEN}
    return sorted(p for p in CONFIG_DIR.rglob("*.yaml") if p not in texts and p not in hand_written)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="fail if a YAML file differs from the generated text")
    args = parser.parse_args()
    texts = render()
    if args.check:
        bad = [p for p, text in texts.items() if not p.exists() or p.read_text() != text] + stale(texts)
        if bad:
            names = ", ".join(str(p.relative_to(ROOT)) for p in bad)
            sys.exit(f"out of date or stale: {names}; run python scripts/generate_trainer_config.py")
        return
    for path, text in texts.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for path in stale(texts):
        print(f"not generated here (remove it if it is left over): {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
