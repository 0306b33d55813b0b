#!/usr/bin/env bash
# The one prepared GPU check (benchmarks/gpu_check.py) on a bare GPU machine, from the project's root.
# Here, first:   bash /work/shared/gpu/prepare.sh          (the project's wheels and the runner into .gpu/)
# Device call:   carry [".gpu"], command `bash benchmarks/gpu_check.sh`; the figures come back from $OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
exec bash .gpu/run.sh python benchmarks/gpu_check.py --output "${OUT:-gpu_check}" "$@"
