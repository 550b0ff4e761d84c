"""``python -m verl.model_merger {merge,test} --backend {fsdp,megatron} --local_dir <checkpoint> ...`` (veRL's names).

``merge`` writes the checkpoint as a Hugging Face folder at ``--target_dir``; ``test`` compares the model it would
write with a reference Hugging Face folder (``--test_hf_dir``) tensor by tensor and exits with status 1 naming the
tensors that differ. Errors (a missing or damaged file, keys that do not fit) exit with status 1 and name the file
or key; usage errors (an unsupported option) exit with status 2.

With ``--backend fsdp``, ``--local_dir`` may hold this repository's DCP checkpoint (``.metadata``, ``*.distcp``) or
one written by veRL's FSDP checkpoint manager (``model_world_size_{W}_rank_{R}.pt``, ``fsdp_config.json``); the
layout is detected. With ``--backend megatron`` it holds the Megatron engine's rank files
(``mp_rank_<tp>_<pp>_<dp>.pt``; `verl.model_merger.megatron`).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

SUPPORTED_BACKENDS = ("fsdp", "megatron")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``python -m verl.model_merger``."""
    parser = argparse.ArgumentParser(
        prog="python -m verl.model_merger", description="Merge sharded training checkpoints into Hugging Face folders"
    )
    subparsers = parser.add_subparsers(dest="operation", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--backend", required=True, help="checkpoint backend: fsdp, or megatron (the Megatron engine's rank files)"
    )
    common.add_argument(
        "--local_dir", required=True, help="the checkpoint folder, e.g. .../global_step_N/actor (DCP or veRL's layout)"
    )
    common.add_argument(
        "--hf_model_config_path",
        default=None,
        help="folder with the model's config.json (and tokenizer files); default <local_dir>/huggingface",
    )
    common.add_argument(
        "--is-value-model", "--is_value_model", dest="is_value_model", action="store_true", help="a critic"
    )
    common.add_argument("--trust-remote-code", "--trust_remote_code", dest="trust_remote_code", action="store_true")
    common.add_argument(
        "--use_cpu_initialization",
        "--use-cpu-initialization",
        dest="use_cpu_initialization",
        action="store_true",
        help="accepted for compatibility: merging always runs on the CPU here",
    )
    common.add_argument(
        "--tie-word-embedding",
        "--tie_word_embedding",
        dest="tie_word_embedding",
        action="store_true",
        help="accepted for compatibility: tying follows the model config",
    )
    common.add_argument("--dtype", default=None, help="cast the weights (float32, bfloat16, float16); default: keep")
    common.add_argument("--hf_upload_path", default=None, help="not supported: upload --target_dir yourself")
    common.add_argument("--private", action="store_true", help="not supported (hub upload)")

    merge = subparsers.add_parser("merge", parents=[common], help="write the checkpoint as a Hugging Face folder")
    merge.add_argument("--target_dir", required=True, help="output Hugging Face folder")
    test = subparsers.add_parser("test", parents=[common], help="compare the merged model with a Hugging Face folder")
    test.add_argument("--test_hf_dir", required=True, help="reference Hugging Face folder")
    test.add_argument("--atol", type=float, default=0.0, help="allowed absolute difference (default 0: exact)")
    return parser


def _check_usage(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.backend not in SUPPORTED_BACKENDS:
        parser.error(f"--backend {args.backend}: not supported; use one of {list(SUPPORTED_BACKENDS)}")
    if args.hf_upload_path is not None or args.private:
        parser.error(
            "--hf_upload_path/--private: uploading to the Hugging Face Hub is not supported from here; merge into "
            "--target_dir and upload that folder yourself (e.g. `hf upload <repo_id> <target_dir>`)"
        )
    if args.operation == "test" and args.atol < 0:
        parser.error(f"--atol {args.atol}: must be >= 0")


def main(argv: list[str] | None = None) -> int:
    """Run the CLI on ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    _check_usage(parser, args)
    from verl.model_merger.fsdp import compare_fsdp_checkpoint, merge_fsdp_checkpoint  # torch: after the usage checks

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    options = {
        "hf_model_config_path": args.hf_model_config_path,
        "is_value_model": args.is_value_model,
        "trust_remote_code": args.trust_remote_code,
        "dtype": args.dtype,
        "backend": args.backend,
    }
    local_dir = os.path.abspath(args.local_dir)
    try:
        if args.operation == "merge":
            target = merge_fsdp_checkpoint(local_dir, os.path.abspath(args.target_dir), **options)
            print(f"merged {local_dir} into {target}")
            return 0
        count, problems = compare_fsdp_checkpoint(local_dir, args.test_hf_dir, atol=args.atol, **options)
    except (OSError, ValueError) as e:
        sys.stderr.write(f"error: {e}\n")
        return 1
    if problems:
        shown = "\n  ".join(problems[:10])
        more = f"\n  ... and {len(problems) - 10} more" if len(problems) > 10 else ""
        sys.stderr.write(
            f"FAILED: {len(problems)} of {count} tensors of {local_dir} differ from {args.test_hf_dir}:\n  "
            f"{shown}{more}\n"
        )
        return 1
    print(f"ok: all {count} tensors of {local_dir} equal those of {args.test_hf_dir} (atol={args.atol:g})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
