"""Children die with the process that started them, whatever ends it (:mod:`dz_gym.lifeline`).

Each test starts a parent process that starts a real ``dz-gym-serve`` the way dz-gym does (the evaluator's
embedded servers, the wrapper's ``policy=``), or a real ``dz-gym-eval`` that runs its scenes in processes of
their own, ends the parent, and waits (bounded, polling) until the children are gone: after ``kill -9`` of the
parent, of its process group, and after an interpreter exit that left a wrapper unclosed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from dz_gym.server.launch import start_server_process

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc; kills process groups")

BOUND_S = 120  # every wait on a process is bounded by this (the server's own last resort is 30 s)
REPO = Path(__file__).resolve().parents[1]


def _gone(pid: int) -> bool:
    """Whether ``pid`` has ended (a zombie left for a parent that does not reap it has ended too)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def _wait_gone(*pids: int) -> None:
    """Wait (bounded, polling) until every one of ``pids`` has ended; else kill them all and fail."""
    deadline = time.monotonic() + BOUND_S
    while not all(_gone(pid) for pid in pids):
        if time.monotonic() > deadline:
            left = [pid for pid in pids if not _gone(pid)]
            for pid in left:  # leave nothing behind, then fail
                os.kill(pid, signal.SIGKILL)
            pytest.fail(f"processes {left} still running {BOUND_S} s after their parent ended")
        time.sleep(0.2)


def _parent(code: str) -> tuple[subprocess.Popen, list[int]]:
    """A parent process (a session of its own, as ``dz-gym-eval`` in a terminal) running ``code``, which
    prints ``pids P1 P2 ...`` (its servers) and then lives until killed or its code ends; returns the process
    and the pids."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], stdout=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)  # fmt: skip
    line = proc.stdout.readline()  # the parent's own bounds: the launcher's ready-line timeout
    if not line.startswith("pids "):
        proc.kill()
        proc.wait(BOUND_S)
        pytest.fail(f"the parent printed {line!r}, exit status {proc.poll()}")
    return proc, [int(p) for p in line.split()[1:]]


EVALUATOR = """
    import sys, time
    from dz_gym.eval.config import EvalConfig
    from dz_gym.eval.embedded import EmbeddedServers
    servers = EmbeddedServers(EvalConfig(scenes=[1], policy="hold", policy_b="hold", backend="mujoco"),
                              say=lambda line: None).__enter__()
    print("pids", *(s.pid for s in servers.started), flush=True)
    time.sleep(600)
"""


def test_kill_9_of_the_evaluator_ends_its_embedded_servers():
    parent, pids = _parent(EVALUATOR)
    assert len(pids) == 2 and all(not _gone(pid) for pid in pids)
    parent.kill()
    parent.wait(BOUND_S)
    _wait_gone(*pids)


def test_kill_9_of_the_evaluators_process_group_ends_its_embedded_servers():
    parent, pids = _parent(EVALUATOR)
    os.killpg(parent.pid, signal.SIGKILL)  # the servers are in sessions of their own: not in the group
    parent.wait(BOUND_S)
    _wait_gone(*pids)


def test_the_parent_death_signal_ends_the_server_when_a_forked_child_holds_the_pipe():
    """A child the parent forked (no exec) keeps the pipe's write end open: the parent-death signal still
    ends the server when the parent is killed."""
    parent, (pid, child) = _parent("""
        import os, time
        from dz_gym.server.launch import start_server_process
        server = start_server_process(["--policy", "hold", "--quiet"], new_session=True)
        child = os.fork()
        if child == 0:
            time.sleep(600)
            os._exit(0)
        print("pids", server.pid, child, flush=True)
        time.sleep(600)
    """)
    try:
        parent.kill()
        parent.wait(BOUND_S)
        _wait_gone(pid)
    finally:
        os.kill(child, signal.SIGKILL)


def test_an_unclosed_wrapper_at_interpreter_exit_ends_its_server():
    parent, (pid,) = _parent("""
        from dz_gym.testing.toy_env import ToyDroidEnv
        from dz_gym.wrapper import DreamZeroPolicyWrapper
        env = DreamZeroPolicyWrapper(ToyDroidEnv(num_envs=1), policy="hold")
        print("pids", env.embedded_server.pid, flush=True)
        env.reset(seed=0)
        env.step(env.action_space.sample() * 0)  # one real request; then exit without close()
    """)
    assert parent.wait(BOUND_S) == 0
    _wait_gone(pid)


def test_eof_on_stdin_stops_the_server_cleanly():
    """The pipe alone (what a launcher's end closes): the server's own clean stop, its summary line printed."""
    server = start_server_process(["--policy", "hold", "--quiet"], timeout=BOUND_S)
    try:
        server.proc.stdin.close()
        assert server.proc.wait(BOUND_S) == 0
    finally:
        server.stop()
    assert server.summary().get("requests") == "0"
    assert "is gone (EOF on stdin)" in server.log_text()


def test_a_server_started_on_a_thread_that_ends_keeps_running():
    """The parent-death signal comes when the starting *thread* ends: the server tells that from its parent's
    end and keeps serving."""
    started = []
    thread = threading.Thread(
        target=lambda: started.append(start_server_process(["--policy", "hold"], timeout=BOUND_S))
    )
    thread.start()
    thread.join(BOUND_S)
    (server,) = started
    try:
        from dz_gym.transport import SessionPool

        pool = SessionPool([server.url + "/v1/realtime/robot/openpi"], num_sessions=1)
        try:
            pool.connect()  # a full handshake after the thread ended: the signal, if any, has been handled
        finally:
            pool.close()
        assert server.poll() is None
    finally:
        code = server.stop()
    assert code == 0 and "is gone" not in server.log_text()


def test_a_launcher_without_die_with_parent_leaves_stdin_alone():
    server = start_server_process(["--policy", "hold", "--quiet"], timeout=BOUND_S, die_with_parent=False)
    try:
        assert server.proc.stdin is None
        assert not any("--parent-pid" in arg for arg in server.proc.args)
    finally:
        assert server.stop() == 0


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (Linux: ``/proc/PID/task/*/children``)."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out += [int(child) for child in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return out


@pytest.mark.slow  # two scene processes on the embedded simulator start (seconds; more under load)
def test_kill_9_of_an_evaluator_with_scene_processes_ends_them_and_their_servers(tmp_path):
    """``--process-per-scene``: each scene's ``dz-gym-eval`` (a session of its own) and its embedded server stop
    when the evaluator's process group is killed."""
    from eval_process import Evaluator

    argv = ["--backend", "mujoco", "--num-envs", "2", "--scene", "1", "--scene", "2", "--episodes", "400",
            "--max-steps", "400", "--policy", "hold", "--process-per-scene", "--no-video", "--no-report",
            "--no-progress", "--output-root", str(tmp_path)]  # fmt: skip
    evaluator = Evaluator(argv)
    scenes: list[int] = []
    theirs: list[int] = []
    try:
        for _ in range(2):  # each scene's process started its server
            evaluator.wait_for_line("started the embedded reference server")
        scenes = _children(evaluator.proc.pid)
        theirs = [child for scene in scenes for child in _children(scene)]  # servers and simulator workers
        servers = [pid for pid in theirs if b"dz_gym.server" in Path(f"/proc/{pid}/cmdline").read_bytes()]
        assert len(scenes) == 2 and len(servers) == 2, (scenes, theirs)
        evaluator.signal_group(signal.SIGKILL)
        evaluator.wait_for_line("is gone (EOF on stdin): stopping")  # a scene's process saw its parent go
        _wait_gone(*scenes, *theirs)
    finally:
        if evaluator.proc.poll() is None:
            evaluator.proc.kill()
        evaluator.proc.wait(BOUND_S)
        for pid in [*scenes, *theirs]:  # after a failure: leave nothing behind
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)
