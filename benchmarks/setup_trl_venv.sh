#!/usr/bin/env bash
# Build TRL in a venv of its own, for benchmarks/bench_vs_trl.py: TRL is the peer we measure against, never a
# dependency of the package.
#   bash benchmarks/setup_trl_venv.sh            # builds .venv-trl next to the repository's .venv
# Env: PYTHON (interpreter, default python3), TRL_VENV (venv folder, default .venv-trl), TRL_VERSION (1.16.0).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PYTHON="${PYTHON:-python3}"
TRL_VENV="${TRL_VENV:-.venv-trl}"
TRL_VERSION="${TRL_VERSION:-1.16.0}"

if [ ! -x "$TRL_VENV/bin/python" ]; then
  "$PYTHON" -m venv "$TRL_VENV"
fi
"$TRL_VENV/bin/python" -m pip install -q --upgrade pip
# the CPU torch first and pinned, as for our own venvs; the same transformers as ours, so both load one model
"$TRL_VENV/bin/python" -m pip install -q torch==2.13.0
"$TRL_VENV/bin/python" -m pip install -q "trl==$TRL_VERSION" "transformers==5.24.0" datasets
# (the models come from our side: bench_vs_trl.py writes each one as an HF folder that both sides load)
"$TRL_VENV/bin/python" -c "import trl, transformers, torch; print('trl', trl.__version__, 'transformers', transformers.__version__, 'torch', torch.__version__)"
