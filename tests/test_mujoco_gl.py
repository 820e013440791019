"""GL set-up of the embedded simulator: the backend MuJoCo really loaded, one-line errors, never an abort.

Each case runs in a fresh interpreter, since MuJoCo binds its GL backend once per process at its import
(and a process whose GL set-up failed once in MuJoCo's C code aborts on the next try, exit 134).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("mujoco")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ABORT = 134  # SIGABRT as the shell reports it; subprocess reports -6
SIGABRT_RC = -6


def run_script(body: str, **env_changes: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("MUJOCO_GL", "PYOPENGL_PLATFORM", "DISPLAY")}
    for key, value in env_changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    env["PYTHONPATH"] = os.pathsep.join([REPO, env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(body)], env=env, capture_output=True, text=True, timeout=240
    )


TWO_ENVS = textwrap.dedent("""
    import dz_gym
    from dz_gym.envs.mujoco import gl
    for attempt in range(2):
        try:
            env = dz_gym.make_droid_env(num_envs=2, scene=1, num_workers=0)
        except gl.RenderingUnavailable as exc:
            print("ERROR", str(exc).replace("\\n", "<newline>"))
            continue
        obs, _ = env.reset(seed=0)
        print("OK", gl.loaded_backend(), int(obs["policy"]["external_cam"].std() > 5))
        env.close()
""")


def outcome(result: subprocess.CompletedProcess) -> list[str]:
    assert result.returncode not in (ABORT, SIGABRT_RC), result.stderr[-2000:]
    assert result.returncode == 0, result.stderr[-2000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith(("OK", "ERROR"))]
    assert len(lines) == 2, result.stdout + result.stderr[-2000:]
    return lines


def test_mujoco_imported_first_with_glfw_and_no_display_refuses_with_one_line_twice():
    """The reported abort: ``MUJOCO_GL=glfw``, ``import mujoco``, no display, then two envs in-process."""
    lines = outcome(run_script("import mujoco\n" + TWO_ENVS, MUJOCO_GL="glfw"))
    for line in lines:
        assert line.startswith("ERROR rendering: mujoco was imported with MUJOCO_GL=glfw"), line
        assert "DISPLAY is not set" in line and "set MUJOCO_GL=egl" in line and "<newline>" not in line
    assert lines[0] == lines[1]


def test_worker_processes_with_glfw_and_no_display_refuse_with_one_line():
    """Workers start with the backend the user chose (``MUJOCO_GL=glfw``): the same cause reaches the caller."""
    body = "import mujoco\n" + TWO_ENVS.replace("num_workers=0", "num_workers=1")
    lines = outcome(run_script(body, MUJOCO_GL="glfw"))
    for line in lines:
        assert line.startswith("ERROR rendering: no OpenGL context (MUJOCO_GL tried: glfw; glfw: mujoco was"), line
        assert "DISPLAY is not set" in line and "set MUJOCO_GL=egl" in line and "<newline>" not in line


def test_mujoco_imported_first_without_mujoco_gl_renders_headless():
    """``import mujoco`` with ``MUJOCO_GL`` unset binds GLFW; with no display dz-gym renders through EGL (or
    OSMesa) beside it, since the user chose no backend."""
    lines = outcome(run_script("import mujoco\n" + TWO_ENVS, MUJOCO_GL=None))
    assert lines == ["OK glfw 1", "OK glfw 1"], lines


def test_no_mujoco_gl_at_all_picks_egl():
    lines = outcome(run_script(TWO_ENVS, MUJOCO_GL=None))
    assert lines == ["OK egl 1", "OK egl 1"], lines


def test_glfw_without_a_reachable_display_refuses_before_mujoco_sets_up_gl():
    """A ``DISPLAY`` that names no server: GLFW makes no window and says so only by warnings; dz-gym checks
    that a context is current before MuJoCo's set-up runs."""
    lines = outcome(run_script("import mujoco\n" + TWO_ENVS, MUJOCO_GL="glfw", DISPLAY=":987"))
    for line in lines:
        assert line.startswith("ERROR rendering: no OpenGL context (MUJOCO_GL tried: glfw;"), line
        assert "DISPLAY=:987" in line and "MUJOCO_GL=egl" in line


def test_a_failed_gl_set_up_is_remembered_instead_of_retried():
    """MuJoCo's own set-up failing once (here: handed a context that is not current) makes the next try
    abort the process; dz-gym raises the first error again instead."""
    result = run_script(
        """
        import mujoco
        from dz_gym.envs.mujoco import gl, scene

        class NotCurrent:  # a context object that makes nothing current: MuJoCo's set-up then fails
            def make_current(self):
                pass

            def free(self):
                pass

        gl.open_context = lambda height, width: ("glfw", NotCurrent())
        model = scene.build_model(1, (48, 80))
        messages = []
        for attempt in range(3):
            try:
                gl.create_renderer(model, 48, 80)
            except gl.RenderingUnavailable as exc:
                messages.append(str(exc))
        print("ERRORS", len(messages), len(set(messages)))
        print("FIRST", messages[0])
        """,
        MUJOCO_GL="glfw",
    )
    assert result.returncode not in (ABORT, SIGABRT_RC), result.stderr[-2000:]
    assert result.returncode == 0, result.stderr[-2000:]
    assert "ERRORS 3 1" in result.stdout, result.stdout
    first = result.stdout.split("FIRST ", 1)[1].strip()
    assert first.startswith("rendering: no OpenGL context") and "FatalError" in first and "\n" not in first


def test_a_chosen_backend_that_cannot_load_names_the_import_error():
    """``MUJOCO_GL=egl`` with ``PYOPENGL_PLATFORM=osmesa``: MuJoCo's EGL module refuses to import, and MuJoCo
    only defers the error; dz-gym names it and the packages, once per env, without an abort."""
    lines = outcome(run_script(TWO_ENVS, MUJOCO_GL="egl", PYOPENGL_PLATFORM="osmesa"))
    for line in lines:
        assert line.startswith("ERROR rendering: no OpenGL context (MUJOCO_GL tried: egl;"), line
        assert "mujoco could not load its OpenGL backend" in line and "PYOPENGL_PLATFORM" in line
        assert "libegl1" in line and "<newline>" not in line


def test_mujoco_gl_disabled_is_named():
    lines = outcome(run_script("import mujoco\n" + TWO_ENVS, MUJOCO_GL="disable"))
    for line in lines:
        assert line.startswith("ERROR rendering: mujoco was imported with MUJOCO_GL=disable"), line


def test_loaded_backend_is_what_mujoco_bound_not_what_the_variable_says_now():
    result = run_script(
        """
        import os
        import mujoco
        os.environ["MUJOCO_GL"] = "osmesa"  # too late: mujoco bound EGL at its import
        from dz_gym.envs.mujoco import gl
        print(gl.loaded_backend(), gl.backend_in_process())
        """,
        MUJOCO_GL="egl",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["egl", "egl"], result.stdout
