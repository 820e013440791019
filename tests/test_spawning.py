"""dz_gym.spawning: dz-gym's spawn-context workers do not run the caller's script again, so a script without
an ``if __name__ == "__main__":`` guard (or one that launches an app at its top) starts them once; what a start
sets in this process (the worker's variables, a blocked SIGINT) lasts the start only."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dz_gym.spawning import start_worker

REPO = Path(__file__).resolve().parents[1]


def _run_script(tmp_path: Path, body: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    """Run ``body`` as a script with no main guard; it appends a line to a file each time its top runs."""
    marks = tmp_path / "marks.txt"
    script = tmp_path / "unguarded.py"
    script.write_text(f"with open({str(marks)!r}, 'a') as f:\n    f.write('top\\n')\n" + textwrap.dedent(body))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300,
                          cwd=tmp_path, check=False)  # fmt: skip
    return done, marks.read_text().splitlines()


def test_a_transport_pool_in_an_unguarded_script_starts_its_workers_once(tmp_path):
    done, marks = _run_script(
        tmp_path,
        """
        from dz_gym.transport import ProcessSessionPool, TransportConfig

        pool = ProcessSessionPool(["ws://127.0.0.1:9"], 4, TransportConfig(), processes=2)
        print("workers", pool.processes)
        pool.close()
    """,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "workers 2" in done.stdout
    assert marks == ["top"]  # neither worker ran the script's top again


def test_the_embedded_simulators_workers_start_once_in_an_unguarded_script(tmp_path):
    pytest.importorskip("mujoco")
    done, marks = _run_script(
        tmp_path,
        """
        from dz_gym.envs.mujoco.env import make_env

        env = make_env(1, num_envs=2, num_workers=2, image_shape=(36, 64))
        obs, info = env.reset(seed=0)
        print("views", obs["policy"]["external_cam"].shape)
        env.close()
    """,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "views (2, 36, 64, 3)" in done.stdout
    assert marks == ["top"]


def test_the_callers_main_is_back_after_the_start_and_after_a_failed_one():
    main = sys.modules["__main__"]
    process = multiprocessing.get_context("spawn").Process(target=os.getpid, daemon=True)
    start_worker(process)
    process.join(60)
    assert process.exitcode == 0 and sys.modules["__main__"] is main

    class Refusing:
        def start(self):
            assert sys.modules["__main__"] is not main and not hasattr(sys.modules["__main__"], "__file__")
            raise OSError("no processes left")

    with pytest.raises(OSError, match="no processes left"):
        start_worker(Refusing())
    assert sys.modules["__main__"] is main


CHILD_CHECK = (
    "__import__('os')._exit(0 if __import__('os').environ.get('DZ_GYM_SPAWN_CHECK') == 'set' and "
    "__import__('signal').SIGINT in __import__('signal').pthread_sigmask(__import__('signal').SIG_BLOCK, []) "
    "else 3)"
)


def test_the_worker_inherits_its_variables_and_a_blocked_sigint_and_this_process_gets_both_back(monkeypatch):
    """What a start does to this process lasts the start only: the worker sees ``environ`` and SIGINT blocked;
    afterwards this process's environment and signal mask are what they were."""
    import signal

    monkeypatch.delenv("DZ_GYM_SPAWN_CHECK", raising=False)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    process = multiprocessing.get_context("spawn").Process(target=eval, args=(CHILD_CHECK,), daemon=True)
    start_worker(process, {"DZ_GYM_SPAWN_CHECK": "set"})
    process.join(60)
    assert process.exitcode == 0
    assert "DZ_GYM_SPAWN_CHECK" not in os.environ
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == mask

    class Refusing:
        def start(self):
            assert os.environ["DZ_GYM_SPAWN_CHECK"] == "set"
            raise OSError("no processes left")

    monkeypatch.setenv("DZ_GYM_SPAWN_CHECK", "the user's")
    with pytest.raises(OSError, match="no processes left"):
        start_worker(Refusing(), {"DZ_GYM_SPAWN_CHECK": "set"})
    assert os.environ["DZ_GYM_SPAWN_CHECK"] == "the user's"
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == mask
