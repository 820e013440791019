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
#
# Every stage runs even when an earlier one failed (a stage whose environment could not be installed is
# reported as not run): the last lines list every environment skipped and every stage that failed, and the
# exit status is then 1.
set -uo pipefail
cd "$(dirname "$0")/.."

failed=()
skipped=()  # environments left out on purpose (DZ_GYM_SKIP_*) or for want of their Python: said again at the end

stage() {  # stage NAME COMMAND...: run COMMAND; a failure is remembered under NAME and the script goes on
  local name=$1
  shift
  echo "== $name =="
  local status=0
  "$@" || status=$?
  if [ $status != 0 ]; then
    failed+=("$name (exit status $status)")
  fi
  return $status
}

not_run() {  # not_run WHY NAME...: stages that cannot run, each remembered as a failure
  local why=$1
  shift
  for name in "$@"; do
    echo "== $name: not run ($why) =="
    failed+=("$name (not run: $why)")
  done
}

third_environment() {  # the real isaaclab 3.0.0 wheel on Python 3.12: exit 0 (passed or skipped) or the failure
  local status=0
  bash scripts/setup.sh --isaac30 || status=$?
  if [ $status = 2 ]; then
    echo "== skipped: no Python 3.12 here (set PYTHON for scripts/setup.sh --isaac30) =="
    : > "$third_skipped"  # said again at the end
    return 0
  elif [ $status != 0 ]; then
    echo "== scripts/setup.sh --isaac30 failed (exit status $status) =="
    return $status
  fi
  .venv-isaac30/bin/python -m pytest -q -p no:cacheprovider tests/test_isaac_wheels.py tests/test_isaac3_setup.py \
    tests/test_isaac3_kitless_cpu.py
}

export MUJOCO_GL=${MUJOCO_GL:-egl}
if stage "setup (.venv)" bash scripts/setup.sh --test; then
  stage "ruff check" .venv/bin/python -m ruff check .
  stage "ruff format --check" .venv/bin/python -m ruff format --check .
  stage "pytest" .venv/bin/python -m pytest -q "$@"
  stage "doctests" .venv/bin/python -m pytest -q --doctest-modules dz_gym
else
  not_run "scripts/setup.sh --test failed" "ruff check" "ruff format --check" "pytest" "doctests"
fi

third_log=$(mktemp)
third_skipped="$third_log.skipped"  # made by third_environment when there is no Python 3.12
third_pid=
trap '[ -z "$third_pid" ] || kill "$third_pid" 2>/dev/null; rm -f "$third_log" "$third_skipped"' EXIT
if [ "${DZ_GYM_SKIP_ISAAC22:-0}" = 0 ]; then
  echo "== second environment: Isaac Lab 2.2's dependency set (.venv-isaac22) =="
  stage "setup (.venv-isaac22)" bash scripts/setup.sh --test --isaac22
  second_setup=$?
  if [ "${DZ_GYM_SKIP_ISAAC30:-0}" = 0 ]; then  # the third runs beside the second's tests (its output follows)
    third_environment > "$third_log" 2>&1 &
    third_pid=$!
  fi
  if [ $second_setup = 0 ]; then
    stage "pytest (.venv-isaac22)" .venv-isaac22/bin/python -m pytest -q -m "not slow" "$@"
    stage "doctests (.venv-isaac22)" .venv-isaac22/bin/python -m pytest -q --doctest-modules dz_gym
  else
    not_run "scripts/setup.sh --test --isaac22 failed" "pytest (.venv-isaac22)" "doctests (.venv-isaac22)"
  fi
else
  skipped+=("second environment (.venv-isaac22): DZ_GYM_SKIP_ISAAC22=1")
fi
third="third environment: the real isaaclab 3.0.0 wheel on Python 3.12 (.venv-isaac30)"
if [ "${DZ_GYM_SKIP_ISAAC30:-0}" = 0 ]; then
  echo "== $third =="
  status=0
  if [ -n "$third_pid" ]; then
    wait "$third_pid" || status=$?
    third_pid=
    cat "$third_log"
  else
    third_environment || status=$?
  fi
  if [ $status != 0 ]; then
    failed+=("$third (exit status $status)")
  elif [ -e "$third_skipped" ]; then
    skipped+=("$third: no Python 3.12 here")
  fi
else
  skipped+=("$third: DZ_GYM_SKIP_ISAAC30=1")
fi

if [ ${#skipped[@]} != 0 ]; then
  echo "== skipped: ${#skipped[@]} environment(s) =="
  printf '  %s\n' "${skipped[@]}"
fi
if [ ${#failed[@]} != 0 ]; then
  echo "== FAILED: ${#failed[@]} stage(s) =="
  printf '  %s\n' "${failed[@]}"
  exit 1
fi
echo "== every stage passed =="
