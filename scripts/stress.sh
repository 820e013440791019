#!/usr/bin/env bash
# Rerun the timing- and signal-sensitive tests N times in a row (default 10) while busy processes keep every
# core loaded, with SIGINT ignored (as for a background job of a script, nohup under some shells, some CI
# runners), and print a summary: runs, passes, failures and which tests failed in which run.
#
#   bash scripts/stress.sh [N] [pytest args...]      e.g. bash scripts/stress.sh 3 -x
#
# The tests: signals and Ctrl-C (dz-gym-eval's stop handler, the CLI under Ctrl-C/SIGTERM, dz-gym-serve),
# Ray (Ctrl-C and a killed shard on a loopback cluster), transport faults, network faults (a proxy that
# injects latency, stalls, resets, half-open connections), re-sends, idle closes and refused sessions.
# STRESS_TESTS replaces the list (pytest node ids or files, space-separated); STRESS_LOAD sets the number of
# busy processes (default: one per core, 0 for none); STRESS_LOG_DIR keeps each run's output (default: a
# temporary folder).
# Exit status: 0 when every run passed.
set -uo pipefail
cd "$(dirname "$0")/.."

runs=${1:-10}
if [ $# -gt 0 ]; then shift; fi
case "$runs" in
  '' | *[!0-9]*) echo "stress.sh: N: expected a positive integer, got '$runs'" >&2; exit 2 ;;
esac
if [ "$runs" -lt 1 ]; then echo "stress.sh: N: expected a positive integer, got '$runs'" >&2; exit 2; fi

python=${PYTHON:-.venv/bin/python}
if [ ! -x "$python" ]; then echo "stress.sh: $python not found: run bash scripts/setup.sh --test first" >&2; exit 2; fi
export MUJOCO_GL=${MUJOCO_GL:-egl}

default_tests="tests/test_eval_cli.py tests/test_server.py tests/test_faults.py tests/test_network_faults.py
tests/test_transport.py tests/test_resend.py tests/test_idle_episodes.py
tests/test_admission.py::test_server_refuses_beyond_the_cap_and_frees_on_reset_switch_and_close
tests/test_admission.py::test_wrapper_waits_for_admission_without_a_tight_loop
tests/test_admission.py::test_ended_episodes_free_their_sessions_on_the_server
tests/test_eval_e2e.py::test_sigint_then_resume_equals_an_uninterrupted_run
tests/test_eval_e2e.py::test_double_sigint_mid_run_keeps_results_and_removes_partial_videos
tests/test_eval_e2e.py::test_sigint_while_simulator_workers_start
tests/test_eval_e2e.py::test_sigterm_is_worded_as_such
tests/test_eval_e2e.py::test_an_ignored_sigint_stays_ignored_and_sigterm_still_stops
tests/test_eval_e2e.py::test_killed_and_restarted_server
tests/test_shards_ray.py::test_cli_ctrl_c_then_resume_on_the_cluster
tests/test_shards_ray.py::test_a_killed_shard_loses_nothing
tests/test_shards_ray.py::test_a_shard_lost_beyond_its_restarts_is_recorded_errored
tests/test_shards_ray.py::test_start_line_holds_a_built_shard_until_every_shard_is_built"
read -r -a tests <<<"$(echo ${STRESS_TESTS:-$default_tests})"

logs=${STRESS_LOG_DIR:-$(mktemp -d -t dz-gym-stress.XXXXXX)}
mkdir -p "$logs"
load=${STRESS_LOAD:-$(nproc)}

busy=()
stop_load() {
  for pid in "${busy[@]}"; do kill "$pid" 2>/dev/null; done
  for pid in "${busy[@]}"; do wait "$pid" 2>/dev/null; done
  busy=()
}
trap stop_load EXIT
trap 'stop_load; exit 143' TERM
for _ in $(seq 1 "$load"); do
  "$python" -c 'while True: pass' &
  busy+=("$!")
done

echo "stress: $runs run(s) of ${#tests[@]} test selection(s), $load busy process(es) on $(nproc) core(s), SIGINT ignored"
echo "stress: logs in $logs"
start=$(date +%s)
passed=0
failed=0
failures=()
for k in $(seq 1 "$runs"); do
  t0=$(date +%s)
  # SIGINT ignored for pytest and everything it starts, so a Ctrl-C does not end a run: send SIGTERM instead.
  (trap '' INT; exec "$python" -m pytest -q -p no:cacheprovider -rfE "${tests[@]}" "$@") >"$logs/run$k.txt" 2>&1
  code=$?
  t1=$(date +%s)
  last=$(grep -E '(passed|failed|error)' "$logs/run$k.txt" | tail -n 1)
  if [ "$code" -eq 0 ]; then
    passed=$((passed + 1))
    echo "stress: run $k/$runs passed in $((t1 - t0)) s: $last"
  else
    failed=$((failed + 1))
    echo "stress: run $k/$runs FAILED (exit $code) in $((t1 - t0)) s: $last"
    while IFS= read -r line; do
      failures+=("run $k: $line")
    done < <(grep -E '^(FAILED|ERROR) ' "$logs/run$k.txt")
  fi
done
stop_load
total=$(($(date +%s) - start))
echo "stress: summary: $runs run(s), $passed passed, $failed failed, $total s in all (under load $load, SIGINT ignored)"
for line in "${failures[@]}"; do echo "stress:   $line"; done
[ "$failed" -eq 0 ]
