"""Run veRL's own ``*_on_cpu.py`` tests, unchanged, against this checkout; print per-file figures.

veRL's tests are the spec of its interface. This script exports them from a local git copy of veRL's repository
(never from, or into, ours), points their ``verl`` at this checkout's package, runs them in one pytest process
with this checkout's interpreter, and does the same against veRL's own package at that commit. It prints, per file,
what veRL passes, what ours passes, and how many of veRL's passing tests ours passes (the figure we target).

    git clone https://github.com/verl-project/verl /tmp/verl        # or any local mirror
    pip install --target /tmp/verl-deps orjson pylatexenc            # what veRL's package imports beyond ours
    PYTHONPATH=/tmp/verl-deps python scripts/verl_cpu_tests.py --verl /tmp/verl --generation v010
    python scripts/verl_cpu_tests.py --verl /tmp/volcengine-verl --generation early2026 \
        --only tests/test_protocol_on_cpu.py

A generation names the veRL commit and the files in scope. Files that test what another issue builds (Megatron,
SGLang, vLLM internals, multimodal inputs, distillation, the transfer queue) are listed with that reason and not run
unless ``--all``.
"""

from __future__ import annotations

import argparse
import collections
import logging
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

EARLY_2026 = {  # volcengine/verl b178a3c: the files of the carry-over issue
    "rev": "b178a3c",
    "in_scope": [
        "tests/test_protocol_on_cpu.py",
        "tests/test_protocol_v2_on_cpu.py",
        "tests/test_base_config_on_cpu.py",
        "tests/trainer/ppo/test_core_algos_on_cpu.py",
        "tests/trainer/ppo/test_metric_utils_on_cpu.py",
        "tests/single_controller/test_decorator_on_cpu.py",
        "tests/single_controller/test_auto_padding_on_cpu.py",
        "tests/single_controller/test_fused_workers_on_cpu.py",
        "tests/single_controller/test_ray_local_envs_on_cpu.py",
        "tests/single_controller/test_ray_utils_on_cpu.py",
        "tests/utils/dataset/test_rl_collate_fn_on_cpu.py",
        "tests/workers/reward_manager/test_registry_on_cpu.py",
        "tests/trainer/config/test_algo_config_on_cpu.py",
        "tests/trainer/config/test_legacy_config_on_cpu.py",
        "tests/workers/config/test_actor_config_on_cpu.py",
        "tests/workers/config/test_engine_config_on_cpu.py",
        "tests/workers/config/test_optim_config_on_cpu.py",
        "tests/utils/test_config_on_cpu.py",
        "tests/utils/test_import_utils_on_cpu.py",
        "tests/utils/test_fs_on_cpu.py",
    ],
    "out_of_scope": {},
}

_LATER = "issue 42 (V1 trainer)"
_DISTILL = "veRL's FSDP distillation internals (verl.trainer.distillation.fsdp's private helpers)"
_MEGATRON = "veRL's Megatron internals (its engine module, checkpoint manager, Muon optimizer, router replay)"
_SGLANG = "veRL's SGLang LoRA-merge internals (and the sglang venv)"
_VLLM = "vLLM internals (weight names, CLI args, quantisation, disaggregation)"
_MM = "multimodal / audio inputs"
_TQ = "TransferQueue (an external service)"

V010 = {  # verl-project/verl 1dda039 (2026-08-22): the snapshot the V1 interface map describes
    "rev": "1dda039",
    "in_scope": [
        "tests/checkpoint_engine/test_global_steps_on_cpu.py",
        "tests/experimental/fully_async_policy/test_async_genrm_config_on_cpu.py",
        "tests/experimental/reward_loop/test_async_token_bucket_on_cpu.py",
        "tests/experimental/reward_loop/test_rate_limited_reward_manager_on_cpu.py",
        "tests/checkpoint_engine/test_fsdp_lora_only_checkpoint_on_cpu.py",
        "tests/experimental/agent_loop/test_agent_loop_extra_fields_schema_on_cpu.py",
        "tests/experimental/agent_loop/test_call_tool_on_cpu.py",
        "tests/experimental/agent_loop/test_qwen3_tool_parser_on_cpu.py",
        "tests/experimental/agent_loop/test_tool_call_id_on_cpu.py",
        "tests/model_merger/test_output_validation_on_cpu.py",
        "tests/single_controller/test_auto_padding_on_cpu.py",
        "tests/single_controller/test_decorator_on_cpu.py",
        "tests/single_controller/test_fused_workers_on_cpu.py",
        "tests/single_controller/test_ray_local_envs_on_cpu.py",
        "tests/single_controller/test_ray_utils_on_cpu.py",
        "tests/test_base_config_on_cpu.py",
        "tests/test_protocol_on_cpu.py",
        "tests/test_protocol_v2_on_cpu.py",
        "tests/tools/test_function_tool_on_cpu.py",
        "tests/tools/test_mixed_tools_on_cpu.py",
        "tests/trainer/ppo/test_core_algos_on_cpu.py",
        "tests/trainer/ppo/test_dynamic_policy_losses_on_cpu.py",
        "tests/trainer/ppo/test_loss_aggregation_on_cpu.py",
        "tests/trainer/ppo/test_metric_utils_on_cpu.py",
        "tests/trainer/ppo/test_reinforce_pp_multiturn_on_cpu.py",
        "tests/trainer/ppo/test_rollout_moe_lb_metrics_on_cpu.py",
        "tests/trainer/ppo/test_spec_decode_metrics_on_cpu.py",
        "tests/trainer/ppo/test_value_loss_normalization_on_cpu.py",
        "tests/trainer/ppo/v1/test_metrics_aggregator_on_cpu.py",
        "tests/trainer/test_constants_ppo_on_cpu.py",
        "tests/trainer/test_multi_trajectories_advantage_on_cpu.py",
        "tests/utils/ckpt/test_checkpoint_cleanup_on_cpu.py",
        "tests/utils/ckpt/test_esi_save_ckpt_on_cpu.py",
        "tests/utils/ckpt/test_lora_custom_object_save_on_cpu.py",
        "tests/utils/dataset/test_multiturn_sft_dataset_on_cpu.py",
        "tests/utils/dataset/test_rl_collate_fn_on_cpu.py",
        "tests/utils/dataset/test_rl_dataset_on_cpu.py",
        "tests/utils/reward_score/reward_score/test_sandbox_fusion_on_cpu.py",
        "tests/utils/reward_score/test_sandbox_on_cpu.py",
        "tests/utils/test_config_on_cpu.py",
        "tests/utils/test_fs_on_cpu.py",
        "tests/utils/test_fsdp_wrap_policy_on_cpu.py",
        "tests/utils/test_import_utils_on_cpu.py",
        "tests/utils/test_model_on_cpu.py",
        "tests/utils/test_normalize_peft_param_name_on_cpu.py",
        "tests/utils/test_padding_on_cpu.py",
        "tests/utils/test_rollout_trace_on_cpu.py",
        "tests/utils/test_temp_env_on_cpu.py",
        "tests/utils/test_tokenizer_normalize_on_cpu.py",
        "tests/utils/test_tracking_on_cpu.py",
        "tests/utils/test_turn_separator_on_cpu.py",
        "tests/workers/config/test_actor_config_on_cpu.py",
        "tests/workers/config/test_critic_config_on_cpu.py",
        "tests/workers/config/test_engine_config_on_cpu.py",
        "tests/workers/config/test_model_config_on_cpu.py",
        "tests/workers/config/test_optim_config_on_cpu.py",
        "tests/workers/reward_manager/test_dapo_on_cpu.py",
        "tests/workers/reward_manager/test_naive_on_cpu.py",
        "tests/workers/reward_manager/test_registry_on_cpu.py",
        "tests/workers/rollout/test_llm_server_response_length_cap_on_cpu.py",
    ],
    "out_of_scope": {
        "tests/trainer/ppo/v1/test_agent_loop_tq_on_cpu.py": _TQ,
        "tests/trainer/ppo/v1/test_compute_reward_colocate_on_cpu.py": _LATER,
        "tests/trainer/ppo/v1/test_reissue_inflight_on_cpu.py": _LATER,
        "tests/trainer/ppo/v1/test_replay_buffer_on_cpu.py": _LATER,
        "tests/trainer/ppo/v1/test_rollout_profiling_on_cpu.py": _LATER,
        "tests/trainer/ppo/v1/test_separate_async_step_switch_on_cpu.py": _LATER,
        "tests/trainer/ppo/v1/test_streaming_feed_on_cpu.py": _LATER,
        "tests/trainer/ppo/v1/test_trainer_base_on_cpu.py": _LATER,
        "tests/workers/test_chunked_topk_log_probs_on_cpu.py": _DISTILL,
        "tests/workers/test_distillation_topk_symmetry_on_cpu.py": _DISTILL,
        "tests/workers/test_megatron_distillation_only_on_cpu.py": _MEGATRON,
        "tests/workers/test_megatron_ddp_config_on_cpu.py": _MEGATRON,
        "tests/workers/test_megatron_value_head_cp_layout_on_cpu.py": _MEGATRON,
        "tests/utils/ckpt/test_megatron_checkpoint_manager_on_cpu.py": _MEGATRON,
        "tests/utils/megatron/test_muon_layerwise_bridge_ddp_on_cpu.py": _MEGATRON,
        "tests/utils/megatron/test_muon_optim_realcfg_on_cpu.py": _MEGATRON,
        "tests/utils/megatron/test_muon_optim_wiring_on_cpu.py": _MEGATRON,
        "tests/utils/megatron/test_router_replay_model_walk_on_cpu.py": _MEGATRON,
        "tests/workers/test_router_replay_engine_helpers_on_cpu.py": _MEGATRON,
        "tests/workers/rollout/rollout_sglang/test_lora_merge_mode_on_cpu.py": _SGLANG,
        "tests/workers/rollout/rollout_vllm/test_mtp_hybrid_sleep_acceptance_on_cpu.py": _VLLM,
        "tests/workers/rollout/test_vllm_cli_args_on_cpu.py": _VLLM,
        "tests/workers/rollout/test_vllm_moe_param_converter_on_cpu.py": _VLLM,
        "tests/workers/rollout/test_vllm_pd_disaggregation_on_cpu.py": _VLLM,
        "tests/workers/rollout/test_vllm_weight_update_utils_on_cpu.py": _VLLM,
        "tests/workers/rollout/test_llm_server_routed_experts_on_cpu.py": _MEGATRON,
        "tests/utils/test_vllm_quant_utils_moe_on_cpu.py": _VLLM,
        "tests/utils/test_vllm_weight_name_normalization_on_cpu.py": _VLLM,
        "tests/utils/veomni/test_moe_param_export_on_cpu.py": "the VeOmni engine (not on our roadmap)",
        "tests/utils/veomni/test_router_replay_on_cpu.py": "the VeOmni engine (not on our roadmap)",
        "tests/experimental/agent_loop/test_audio_server_contract_on_cpu.py": _MM,
        "tests/experimental/agent_loop/test_multimodal_position_ids_on_cpu.py": _MM,
        "tests/workers/rollout/test_vision_placeholder_tokens_on_cpu.py": _MM,
        "tests/utils/test_audio_input_support_on_cpu.py": _MM,
        "tests/utils/test_transferqueue_utils_on_cpu.py": _TQ,
        "tests/models/test_fused_kernels_ulysses_sp_on_cpu.py": "fused CUDA kernels and sequence parallelism > 1",
        "tests/utils/test_continuous_token_on_cpu.py": "veRL's continuous-token rollout internals",
        "tests/utils/test_fsdp2_model_transfer_on_cpu.py": "FSDP1-to-FSDP2 transfer (we only have FSDP2)",
        "tests/utils/test_rl_insight_logger_on_cpu.py": "veRL's RL-Insight logger service",
        "tests/workers/test_engine_forward_step_detach_on_cpu.py": "the engine's private forward step",
        "tests/workers/test_engine_return_model_output_on_cpu.py": "the engine's private forward step",
        "tests/workers/test_engine_workers_mini_batch_trace_on_cpu.py": "the engine's private forward step",
        "tests/workers/test_fsdp_gradient_accumulation_sync_on_cpu.py": "the engine's private forward step",
        "tests/workers/test_packed_pad_to_length_on_cpu.py": "the engine's private forward step",
    },
}

GENERATIONS = {"early2026": EARLY_2026, "v010": V010}


def export_tests(verl_repo: Path, rev: str, dest: Path, against: str) -> Path:
    """Write veRL's ``tests/`` at ``rev`` under ``dest``; return the folder to put on ``PYTHONPATH``.

    ``against="ours"`` points ``dest/verl`` at this checkout's package (veRL's yaml tests read
    ``verl/trainer/config`` beside the tests); ``"verl"`` exports veRL's own package too, for its own figures.
    """
    paths = ["tests"] + (["verl"] if against == "verl" else [])
    archive = subprocess.run(
        ["git", "--git-dir", str(verl_repo), "archive", rev, *paths], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    if against == "verl":
        return dest
    (dest / "verl").symlink_to(ROOT / "verl")
    return ROOT


def git_dir(path: Path) -> Path:
    """The git directory of a clone or of a bare mirror."""
    return path / ".git" if (path / ".git").exists() else path


def run(files: list[str], cwd: Path, pythonpath: Path, junit: Path, extra: list[str]) -> int:
    """One pytest process over ``files``; results land in ``junit``."""
    extra_path = os.environ.get("PYTHONPATH", "")  # e.g. the packages only veRL needs
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(filter(None, [str(pythonpath), extra_path])),
        RAY_AUTH_MODE="disabled",
        HF_HUB_OFFLINE="1",
    )
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-o",
        "asyncio_mode=auto",
        "-o",
        "junit_family=xunit1",
        "--timeout=300",
        "--continue-on-collection-errors",
    ]
    cmd += ["--rootdir", str(cwd), f"--junitxml={junit}", *extra, *files]
    return subprocess.run(cmd, cwd=cwd, env=env).returncode


def outcomes(junit: Path) -> dict[str, dict[str, str]]:
    """``{file: {test id: passed | failed | skipped}}`` from a junit report (a file that fails to import has one
    failed entry)."""
    per_file: dict[str, dict[str, str]] = collections.defaultdict(dict)
    for case in ET.parse(junit).getroot().iter("testcase"):
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "failed"
            elif child.tag == "skipped":
                outcome = "skipped"
        per_file[case.get("file", "?")][f"{case.get('classname')}::{case.get('name')}"] = (
            outcome  # xunit1 names the file
        )
    return per_file


def run_against(against: str, files: list[str], verl_repo: Path, rev: str, extra: list[str]) -> dict:
    """veRL's tests at ``rev`` against ``ours`` or veRL's own package; outcomes per file and test."""
    with tempfile.TemporaryDirectory(prefix="verl-tests-") as tmp:
        cwd = Path(tmp)
        pythonpath = export_tests(verl_repo, rev, cwd, against)
        present = [f for f in files if (cwd / f).exists()]
        for missing in sorted(set(files) - set(present)):
            logging.warning("not in veRL at %s: %s", rev, missing)
        run(present, cwd, pythonpath, cwd / "junit.xml", extra)
        found = outcomes(cwd / "junit.xml")
    return {f: found.get(f, {}) for f in present}


def passed(tests: dict[str, str]) -> int:
    return sum(o == "passed" for o in tests.values())


def table(theirs: dict, ours: dict) -> list[str]:
    """Markdown rows: veRL's passes, ours (of all the file's tests), and ours among the tests veRL passes."""
    lines = ["| veRL test file | veRL passes | ours pass | ours, of veRL's passes |", "|---|---:|---:|---:|"]
    sums = collections.Counter()
    for name in ours:
        mine, their = ours[name], theirs.get(name, {})
        size = max(len(mine), len(their))
        both = sum(mine.get(t) == "passed" for t, o in their.items() if o == "passed")
        row = (passed(their), passed(mine), both)
        sums.update(dict(zip(("theirs", "ours", "both", "size"), (*row, size))))
        lines.append(f"| {name.removeprefix('tests/')} | {row[0]}/{size} | {row[1]}/{size} | {row[2]}/{row[0]} |")
    lines.append(
        f"| **all** | **{sums['theirs']}/{sums['size']}** | **{sums['ours']}/{sums['size']}** | "
        f"**{sums['both']}/{sums['theirs']}** ({100 * sums['both'] / max(sums['theirs'], 1):.1f} %) |"
    )
    return lines


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verl", type=Path, required=True, help="a local git copy of veRL's repository")
    parser.add_argument("--generation", choices=sorted(GENERATIONS), default="v010")
    parser.add_argument("--rev", help="override the generation's commit")
    parser.add_argument("--only", nargs="*", help="run only these test files")
    parser.add_argument("--all", action="store_true", help="also run the files out of scope")
    parser.add_argument("--report", type=Path, help="write the markdown table here as well")
    parser.add_argument("pytest_args", nargs="*", help="after --: more pytest arguments")
    args = parser.parse_args()
    gen = GENERATIONS[args.generation]
    rev = args.rev or gen["rev"]
    files = args.only or list(gen["in_scope"]) + (list(gen["out_of_scope"]) if args.all else [])
    theirs = run_against("verl", files, git_dir(args.verl), rev, args.pytest_args)
    ours = run_against("ours", files, git_dir(args.verl), rev, args.pytest_args)
    lines = [f"veRL's tests at {rev} ({args.generation}), against veRL's own package and against {ROOT}", ""]
    lines += table(theirs, ours)
    if not args.only and not args.all:
        lines += ["", "Out of scope:"] + [
            f"- {f.removeprefix('tests/')}: {why}" for f, why in gen["out_of_scope"].items()
        ]
    text = "\n".join(lines)
    print(text)
    if args.report:
        args.report.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
