#!/usr/bin/env bash
# Run the whole test suite: install (scripts/setup.sh --test), then pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
export MUJOCO_GL=${MUJOCO_GL:-egl}
.venv/bin/python -m pytest -q "$@"
