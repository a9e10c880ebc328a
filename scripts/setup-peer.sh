#!/usr/bin/env bash
# Creates .venv-peer beside .venv: Hugging Face TRL for benchmarks/peer_trl.py only, never a
# dependency of the project. The project's pinned stack (torch, transformers, accelerate, datasets,
# vLLM...) is NOT installed again and NOT changed: .venv-peer's site-packages holds a .pth line that
# puts .venv's site-packages on its path, and TRL goes in with --no-deps, so .venv-peer runs TRL
# against exactly the project's pins. Anything TRL needs that .venv lacks is listed in PEER_EXTRA
# below (today: nothing; scripts/setup-peer.sh --check imports GRPOTrainer to prove it). .venv-peer itself
# holds only TRL and that .pth line.
# Idempotent: a stamp file skips a finished install.
#   --check   import trl's GRPOTrainer under .venv-peer and print the versions it runs with.
set -euo pipefail
cd "$(dirname "$0")/.."
TRL_PIN=trl==1.16.0
PEER_EXTRA=()  # packages TRL imports that the project's stack lacks (installed with --no-deps too)
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3

if [ ! -x .venv/bin/python ]; then
  echo "setup-peer: .venv is missing; run scripts/setup.sh (make setup) first" >&2
  exit 2
fi
# The .pth must point at the site-packages of the same Python: compare major.minor.
venv_py=$(.venv/bin/python -c 'import sys; print("%d.%d" % sys.version_info[:2])')
peer_py=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if [ "$venv_py" != "$peer_py" ]; then
  echo "setup-peer: .venv runs Python $venv_py but $PY is $peer_py; set PYTHON to a Python $venv_py" >&2
  exit 2
fi

stamp=.venv-peer/.installed-$(echo "$TRL_PIN ${PEER_EXTRA[*]-}" | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ]; then
  rm -rf .venv-peer
  # No pip or setuptools of its own: those too come from .venv (pip, run from there, installs into
  # .venv-peer), so nothing in .venv-peer shadows a package of the project's stack.
  "$PY" -m venv --without-pip .venv-peer
  base_site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  peer_site=$(.venv-peer/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "$base_site" > "$peer_site/dapo-venv.pth"  # the project's pins, read-only from here
  # Some machines' pip config lists local package folders that do not exist: drop pip's warning about each.
  set +e
  .venv-peer/bin/python -m pip install -q --no-deps "$TRL_PIN" ${PEER_EXTRA[@]+"${PEER_EXTRA[@]}"} 2>&1 |
    grep -v "^WARNING: Location '.*' is ignored"
  rc=${PIPESTATUS[0]}
  set -e
  [ "$rc" = 0 ] || { echo "setup-peer: pip install $TRL_PIN failed (exit $rc)" >&2; exit "$rc"; }
  touch "$stamp"
fi

if [ "${1:-}" = --check ]; then
  .venv-peer/bin/python - <<'EOF'
import accelerate, datasets, torch, transformers, trl
from trl import GRPOConfig, GRPOTrainer  # noqa: F401  (fails here if TRL needs something .venv lacks)

print(f"trl {trl.__version__} with transformers {transformers.__version__}, accelerate {accelerate.__version__}, "
      f"datasets {datasets.__version__}, torch {torch.__version__}")
EOF
fi
