"""dz_gym.transport.heap: the malloc thresholds are set once, and never where the user set them."""

from __future__ import annotations

import os
import subprocess
import sys

CHECK = "from dz_gym.transport.heap import keep_freed_buffers as k; print(k(), k())"


def _run(extra_env):
    env = {**os.environ, "PYTHONPATH": os.getcwd(), **extra_env}
    for name in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"):
        if name not in extra_env:
            env.pop(name, None)
    return subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, check=True,
                          timeout=60).stdout.split()  # fmt: skip


def test_set_once_on_glibc():
    import platform

    expected = "True" if platform.libc_ver()[0] == "glibc" else "False"
    assert _run({}) == [expected, expected]


def test_user_setting_wins():
    assert _run({"MALLOC_MMAP_THRESHOLD_": "131072"}) == ["False", "False"]
