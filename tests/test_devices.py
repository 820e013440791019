"""GPU pinning (dz_gym.envs.devices): the ids a scheduler gives become the CUDA device and the EGL device id
of the process; the installed MuJoCo's EGL device selection picks the GPU that id names; the MuJoCo env's
worker processes report the EGL device id they inherited."""

from __future__ import annotations

import os

import pytest

from dz_gym.envs.devices import EGL_DEVICE_ENV, NO_GPU, pin_gpu, place_device, place_options


def test_ray_ids_become_the_visible_cuda_index_and_the_egl_device_id():
    pin = pin_gpu([3], cuda_visible="3")  # what Ray sets: the actor sees only its GPU, as cuda:0
    assert (pin.gpu, pin.cuda_device, dict(pin.environ)) == ("3", "cuda:0", {EGL_DEVICE_ENV: "3"})
    pin = pin_gpu(["2", "3"], cuda_visible="2,3")  # a shard of two GPUs runs on the first
    assert (pin.gpu, pin.cuda_device, dict(pin.environ)) == ("2,3", "cuda:0", {EGL_DEVICE_ENV: "2"})
    pin = pin_gpu(["1"], cuda_visible="0,1")  # another order of the visible list
    assert pin.cuda_device == "cuda:1"
    pin = pin_gpu([1], cuda_visible=None)  # Ray told not to set CUDA_VISIBLE_DEVICES: CUDA sees every GPU
    assert pin.cuda_device == "cuda:1" and dict(pin.environ) == {EGL_DEVICE_ENV: "1"}
    uuid = "GPU-5c1d3f1e-0000-0000-0000-000000000000"
    pin = pin_gpu([uuid], cuda_visible=uuid)  # no EGL index for a UUID: MuJoCo keeps its own choice
    assert pin.gpu == uuid and pin.cuda_device == "cuda:0" and dict(pin.environ) == {}
    assert pin_gpu([], cuda_visible="0") == NO_GPU and pin_gpu([], None).environ == {}


def test_a_cuda_device_moves_to_the_pinned_gpu_and_cpu_stays():
    pin = pin_gpu([2], cuda_visible="2")
    assert [place_device(d, pin) for d in ("cuda:3", "cuda", None, "cpu")] == ["cuda:0", "cuda:0", "cuda:0", "cpu"]
    assert place_device("cuda:3", NO_GPU) == "cuda:3" and place_device(None, NO_GPU) is None


def test_isaac_launcher_flags_and_env_keywords_move_to_the_shards_gpu():
    import argparse

    pin = pin_gpu(["1"], cuda_visible="1")
    args = argparse.Namespace(device="cuda:3", headless=True)
    moved = place_options(args, "device", pin)
    assert moved.device == "cuda:0" and moved.headless and args.device == "cuda:3"  # the caller's is kept
    assert place_options(argparse.Namespace(device="cpu"), "device", pin).device == "cpu"
    assert place_options({"device": "cuda", "seed": 1}, "device", pin) == {"device": "cuda:0", "seed": 1}
    assert place_options({"seed": 1}, "device", pin) == {"seed": 1}  # nothing named: the env's default
    assert place_options(args, "", pin) is args and place_options(args, "device", NO_GPU) is args
    assert place_options(None, "device", pin) is None


def _mujoco_egl():
    pytest.importorskip("mujoco")
    if os.environ.get("PYOPENGL_PLATFORM", "egl").lower() != "egl":
        pytest.skip("PyOpenGL is bound to another platform in this process")
    try:
        import mujoco.egl as egl
    except ImportError as exc:  # no libEGL here
        pytest.skip(f"mujoco.egl: {exc}")
    return egl


@pytest.mark.parametrize("physical", [0, 1, 3])
def test_the_installed_mujoco_egl_picks_the_gpu_the_id_names(physical):
    """Four EGL devices, named by their CUDA ids where the driver maps them (MuJoCo 4.0's selection reads
    that map and CUDA_VISIBLE_DEVICES) or in the driver's order (MuJoCo 3.x): the id from pin_gpu selects the
    GPU Ray gave, in both. The devices are plain objects: nothing is opened."""
    egl = _mujoco_egl()
    devices = [f"egl-device-of-gpu-{i}" for i in range(4)]
    pin = pin_gpu([physical], cuda_visible=str(physical))
    device_id = int(pin.environ[EGL_DEVICE_ENV])
    select = getattr(egl, "_select_egl_device", None)
    if select is None:
        pytest.skip("MuJoCo 3.x: MUJOCO_EGL_DEVICE_ID indexes all EGL devices in the driver's order")
    cuda_map = {i: d for i, d in enumerate(devices)}
    visible = egl._parse_cuda_device_ids(str(physical))
    ordered = egl._ordered_egl_devices(devices, cuda_map, visible)
    assert select(ordered, cuda_map, visible, device_id) == devices[physical]
    assert select(devices, None, visible, device_id) == devices[physical]  # no CUDA map: the driver's order


def test_env_workers_report_the_egl_device_id_they_inherited(monkeypatch):
    """The env's worker processes start with spawn and inherit the environment: each reports the EGL device
    id in force (only checked here: this machine's one EGL device is not opened under another id)."""
    pytest.importorskip("mujoco")
    from dz_gym.envs.mujoco import gl, make_env

    monkeypatch.setenv(EGL_DEVICE_ENV, "0")
    env = make_env(scene=1, num_envs=2, seed=0, image_shape=(24, 32), num_workers=2)
    try:
        devices = env.render_devices
    finally:
        env.close()
    assert [d["egl_device_id"] for d in devices] == ["0", "0"]
    assert all(d["backend"] in gl.HEADLESS_BACKENDS for d in devices)
