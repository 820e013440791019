#!/usr/bin/env bash
# Run the whole test suite: install (scripts/setup.sh --test), lint (ruff check and ruff format --check, the
# configuration is in pyproject.toml), then pytest and the docstring examples (pytest --doctest-modules dz_gym).
# Then the same tests again in the environment Isaac Lab 2.2 users have (scripts/setup.sh --test --isaac22:
# Python 3.11, numpy 1.26, gymnasium 1.2.0, websockets 16, and the real isaaclab 2.2.0 wheel), with the
# slow-marked tests left out to bound CI time. DZ_GYM_SKIP_ISAAC22=1 skips that second run. Last, the tests
# of the backend against the real isaaclab 3.0.0 wheel on Python 3.12 (scripts/setup.sh --isaac30), and the
# kit-less task built on the CPU with Newton, Warp and MuJoCo-Warp (tests/test_isaac3_kitless_cpu.py);
# DZ_GYM_SKIP_ISAAC30=1 skips them. The third environment runs beside the second's tests (its output is
# printed after theirs), which bounds CI time: many tests wait on events, not on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
export MUJOCO_GL=${MUJOCO_GL:-egl}
.venv/bin/python -m ruff check .
.venv/bin/python -m ruff format --check .
.venv/bin/python -m pytest -q "$@"
.venv/bin/python -m pytest -q --doctest-modules dz_gym
third_environment() {  # the real isaaclab 3.0.0 wheel on Python 3.12: exit 0 (passed or skipped) or the failure
  local status=0
  bash scripts/setup.sh --isaac30 || status=$?
  if [ $status = 2 ]; then
    echo "== skipped: no Python 3.12 here (set PYTHON for scripts/setup.sh --isaac30) =="
    return 0
  elif [ $status != 0 ]; then
    return $status
  fi
  .venv-isaac30/bin/python -m pytest -q -p no:cacheprovider tests/test_isaac_wheels.py tests/test_isaac3_setup.py \
    tests/test_isaac3_kitless_cpu.py
}
third_log=$(mktemp)
third_pid=
trap '[ -z "$third_pid" ] || kill "$third_pid" 2>/dev/null; rm -f "$third_log"' EXIT
if [ "${DZ_GYM_SKIP_ISAAC22:-0}" = 0 ]; then
  echo "== second environment: Isaac Lab 2.2's dependency set (.venv-isaac22) =="
  bash scripts/setup.sh --test --isaac22
  if [ "${DZ_GYM_SKIP_ISAAC30:-0}" = 0 ]; then  # the third runs beside the second's tests (its output follows)
    third_environment > "$third_log" 2>&1 &
    third_pid=$!
  fi
  .venv-isaac22/bin/python -m pytest -q -m "not slow" "$@"
  .venv-isaac22/bin/python -m pytest -q --doctest-modules dz_gym
fi
if [ "${DZ_GYM_SKIP_ISAAC30:-0}" = 0 ]; then
  echo "== third environment: the real isaaclab 3.0.0 wheel on Python 3.12 (.venv-isaac30) =="
  status=0
  if [ -n "$third_pid" ]; then
    wait "$third_pid" || status=$?
    third_pid=
    cat "$third_log"
  else
    third_environment || status=$?
  fi
  exit $status
fi
