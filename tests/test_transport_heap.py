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


RAISE = (
    "from dz_gym.transport import heap\n"
    "heap.keep_freed_buffers(); first = heap.trim_threshold()\n"
    "heap.keep_freed_buffers(at_least=300 * 2**20); raised = heap.trim_threshold()\n"
    "heap.keep_freed_buffers(at_least=1); heap.keep_freed_buffers(at_least=2**40)\n"
    "print(first, raised, heap.trim_threshold(), heap.TRIM_CAP)"
)


def test_a_large_round_raises_the_trim_threshold_up_to_the_cap():
    """A caller holding more than the trim threshold (a round of N requests) raises it: doubled at least, never
    lowered, never past the cap (mallopt takes a C int)."""
    import platform

    if platform.libc_ver()[0] != "glibc":
        return
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    for name in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"):
        env.pop(name, None)
    out = subprocess.run([sys.executable, "-c", RAISE], env=env, capture_output=True, text=True, check=True,
                         timeout=60).stdout.split()  # fmt: skip
    first, raised, last, cap = (int(v) for v in out)
    assert first == 256 * 2**20
    assert raised == min(cap, 512 * 2**20)  # 300 MiB asked for: the threshold doubles
    assert last == cap <= 2**31 - 1


def test_a_user_setting_is_not_raised_either():
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "MALLOC_TRIM_THRESHOLD_": "1048576"}
    code = "from dz_gym.transport import heap; print(heap.keep_freed_buffers(at_least=2**30), heap.trim_threshold())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                         timeout=60).stdout.split()  # fmt: skip
    assert out == ["False", "0"]
