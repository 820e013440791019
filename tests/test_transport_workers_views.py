"""HostViews and the requests that go to a ProcessSessionPool's workers by reference (loopback servers only).

A block lives while any view of it does and while a worker has not taken its bytes; the server receives
packb's bytes for requests whose views lie in the pool's view memory, with nothing copied into an arena;
requests by reference and by copy keep one session's order; a RequestBatch's requests are framed from its
template (by the workers where its views lie in the view memory, in-process otherwise) into the same bytes;
:meth:`HostViews.reserve` makes a populated segment ahead of time where the pool was given ``populate_views``
(the wrapper calls it at reset), and nothing without it (nor any page-locking without ``page_lock``); a segment
that cannot be set up is unlinked; ``_to_host`` lands the views in the block it is given (host tensors stand
in for CUDA ones: the copy and the layout are the same code), and the wrapper builds the pool its transport
config asks for.
"""

from __future__ import annotations

import concurrent.futures
import gc

import numpy as np
import pytest

from dz_gym.profiling import StageProfiler
from dz_gym.protocol import packb
from dz_gym.testing.servers import ServerThread, replying
from dz_gym.transport import ProcessSessionPool, TransportConfig
from dz_gym.transport.workers import handle
from dz_gym.transport.workers.messages import ARENA, SEND, TOOK, VIEWS
from dz_gym.transport.workers.segments import create_segment
from dz_gym.transport.workers.views import FIRST_VIEWS_SEGMENT_BYTES, HostViews

pytestmark = pytest.mark.timeout(120)

FAST = TransportConfig(open_timeout=5, request_timeout=30, close_timeout=2, connect_retries=0)
BOUND_S = 60.0
VIEW = (180, 320, 3)


def views_of(block: np.ndarray, count: int) -> np.ndarray:
    """``count`` images of VIEW shape laid out in ``block`` (the layout ``_to_host`` gives a camera)."""
    return block[: count * int(np.prod(VIEW))].reshape(count, *VIEW)


def request(k: int, image: np.ndarray) -> dict:
    return {
        "observation/exterior_image_0_left": image,
        "observation/joint_position": np.full(7, 0.01 * k),
        "observation/gripper_position": np.zeros(1),
        "prompt": "put the cube in the bowl",
        "session_id": f"episode-{k}",
    }


def recording_server(frames: list[bytes]) -> ServerThread:
    def reply(frame, n):
        frames.append(bytes(frame))
        return {"actions": np.zeros((24, 8), dtype=np.float32)}

    return ServerThread(replying(reply))


# ------------------------------------------------------------------------------------------- HostViews
def test_a_block_lives_while_any_view_of_it_or_a_workers_hold_does():
    announced: list[tuple[int, str]] = []
    views = HostViews(create_segment, lambda k, name: announced.append((k, name)), capacity=2**30)
    try:
        block = views.alloc(1000)
        assert block is not None and block.dtype == np.uint8 and block.shape == (1000,) and block.flags.writeable
        assert [k for k, _ in announced] == [0] and views.names == announced and views.blocks == 1
        row = block[100:400].reshape(3, 100)[1]  # a view of a view keeps the block, not only the segment
        del block
        gc.collect()
        assert views.blocks == 1
        head = np.zeros(10, np.uint8)
        parts, keys, nbytes = views.refer([head, row, b"tail"], 64)  # as packer.fast_parts gives them
        assert parts == [bytes(10), [VIEWS, 0, 200, 100], b"tail"] and keys == [(0, 0)] and nbytes == 114
        (key,) = keys
        del row
        gc.collect()
        assert views.blocks == 1, "the worker's hold keeps it"
        views.release(key)
        assert views.blocks == 0
        again = views.alloc(1000)
        parts, keys, _ = views.refer([again], 64)
        assert parts == [[VIEWS, 0, 0, 1000]]
        views.release(keys[0])
        assert views.refer([np.zeros(100, np.uint8)], 64) is None  # memory of its own: not here
        assert views.refer([again[:10]], 64) is None  # nothing large: nothing to refer to
        readonly = again[:100]
        readonly.flags.writeable = False
        parts, keys, _ = views.refer([readonly], 64)
        assert parts == [[VIEWS, 0, 0, 100]]
        views.release(keys[0])
    finally:
        views.close()
    assert views.alloc(10) is None


def test_no_room_gives_none_and_segments_grow_up_to_the_capacity():
    views = HostViews(create_segment, lambda k, name: None, capacity=3 * FIRST_VIEWS_SEGMENT_BYTES + 4096)
    try:
        small = views.alloc(1000)
        assert small is not None and len(views.names) == 1  # the first segment: FIRST_VIEWS_SEGMENT_BYTES
        large = views.alloc(FIRST_VIEWS_SEGMENT_BYTES)  # no room there: a segment of twice its size
        assert large is not None and len(views.names) == 2
        assert views.alloc(FIRST_VIEWS_SEGMENT_BYTES) is not None  # the rest of that segment
        assert views.alloc(2 * FIRST_VIEWS_SEGMENT_BYTES) is None  # beyond the capacity
        del large
        gc.collect()
        assert views.alloc(FIRST_VIEWS_SEGMENT_BYTES) is not None
        with pytest.raises(ValueError, match="nbytes"):
            views.alloc(0)
    finally:
        views.close()
    assert small.sum() == 0, "an array outlives the close"
    with pytest.raises(ValueError, match="capacity"):
        HostViews(create_segment, lambda k, name: None, capacity=-1)


def mapped_kib(name: str) -> int | None:
    """This process's resident KiB of the shared-memory segment ``name`` (/proc/self/smaps), None off Linux."""
    try:
        with open("/proc/self/smaps") as smaps:
            lines = smaps.read().splitlines()
    except OSError:
        return None
    total, inside = 0, False
    for line in lines:
        if "-" in line.split(" ", 1)[0] and ":" not in line.split(" ", 1)[0]:  # a mapping's header line
            inside = line.rstrip().endswith("/" + name.lstrip("/"))
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1])
    return total


def test_reserve_makes_a_populated_segment_ahead_of_the_first_alloc():
    views = HostViews(create_segment, lambda k, name: None, capacity=2**30, populate=True)
    try:
        nbytes = FIRST_VIEWS_SEGMENT_BYTES  # a segment of twice its size
        assert views.reserve(nbytes) and views.blocks == 0 and len(views.names) == 1
        (_, name), size = views.names[0], 2 * nbytes
        resident = mapped_kib(name)
        if resident is not None:
            assert resident * 1024 >= size, "its pages are mapped now, not by the first copy"
        assert views.reserve(nbytes) and len(views.names) == 1, "room already there: nothing new"
        block = views.alloc(nbytes)
        assert block is not None and len(views.names) == 1, "the alloc takes the reserved room"
        assert views.reserve(nbytes) and len(views.names) == 1  # the other half of the segment
        for bad in (0, -1, 1.5, True):
            with pytest.raises(ValueError, match="nbytes"):
                views.reserve(bad)
    finally:
        views.close()
    assert not views.reserve(1000)


def test_a_reserve_that_does_not_wait_maps_the_pages_on_a_thread_and_the_next_alloc_takes_them(monkeypatch):
    """``reserve(wait=False)`` returns while a thread maps the new segment's pages (outside the interpreter
    lock); the segment is announced only once taken, by the next alloc, which waits for those pages."""
    import threading

    import dz_gym.transport.workers.views as host_views

    started, release, announced = threading.Event(), threading.Event(), []
    populate = host_views._populate

    def slow_populate(address, size):
        started.set()
        assert release.wait(BOUND_S)
        populate(address, size)

    monkeypatch.setattr(host_views, "_populate", slow_populate)
    views = HostViews(create_segment, lambda k, name: announced.append(name), capacity=2**30, populate=True)
    try:
        nbytes = FIRST_VIEWS_SEGMENT_BYTES
        assert views.reserve(nbytes, wait=False) and started.wait(BOUND_S)
        assert not announced and views.reserve(nbytes, wait=False), "being made: no second segment"
        release.set()
        block = views.alloc(nbytes)
        assert block is not None and len(announced) == 1 and len(views.names) == 1
        resident = mapped_kib(announced[0])
        if resident is not None:
            assert resident * 1024 >= 2 * nbytes, "its pages were mapped by the thread"
    finally:
        release.set()
        views.close()


def test_a_reserve_that_does_not_wait_page_locks_on_its_thread_on_the_callers_device(monkeypatch):
    """Where the caller has CUDA, the thread that maps the pages also registers them (on the caller's current
    device, made current on that thread first), so the caller's next alloc only takes the segment; close
    unregisters it. CUDA cannot run here: the runtime's two calls are recorded instead (torch's
    ``cudaHostRegister`` binding leaves the interpreter lock while the driver pins the pages)."""
    import threading

    import dz_gym.transport.workers.views as host_views

    calls: list[tuple[str, str, object]] = []

    class Runtime:
        def cudaHostRegister(self, address, size, flags):  # noqa: N802 - the CUDA runtime's name
            calls.append(("register", threading.current_thread().name, (size, flags)))
            return 0

        def cudaHostUnregister(self, address):  # noqa: N802
            calls.append(("unregister", threading.current_thread().name, None))
            return 0

    monkeypatch.setattr(host_views, "_cudart", lambda: Runtime())
    monkeypatch.setattr(host_views, "_cuda_device", lambda: 3)
    monkeypatch.setattr(host_views, "_set_device",
                        lambda device: calls.append(("device", threading.current_thread().name, device)))  # fmt: skip
    views = HostViews(create_segment, lambda k, name: None, capacity=2**30, page_lock=True, populate=True)
    try:
        nbytes = FIRST_VIEWS_SEGMENT_BYTES
        assert views.reserve(nbytes, wait=False)
        block = views.alloc(nbytes)
        assert block is not None and views.pinned
        size = views._shared.segments[0].size
        assert calls == [("device", "dz-gym-view-pages", 3), ("register", "dz-gym-view-pages", (size, 0))]
    finally:
        views.close()
    assert calls[-1][0] == "unregister" and len(calls) == 3


def test_a_reserve_whose_thread_had_no_cuda_page_locks_when_taken_once_cuda_is_up(monkeypatch):
    """CUDA initialised after the thread started (no device then): the caller page-locks the segment as it
    takes it, on its own thread."""
    import threading

    import dz_gym.transport.workers.views as host_views

    calls: list[str] = []

    class Runtime:
        def cudaHostRegister(self, address, size, flags):  # noqa: N802
            calls.append(threading.current_thread().name)
            return 0

        def cudaHostUnregister(self, address):  # noqa: N802
            return 0

    views = HostViews(create_segment, lambda k, name: None, capacity=2**30, page_lock=True, populate=True)
    try:
        assert views.reserve(FIRST_VIEWS_SEGMENT_BYTES, wait=False)  # no CUDA here yet
        monkeypatch.setattr(host_views, "_cudart", lambda: Runtime())
        assert views.alloc(1000) is not None and views.pinned
        assert calls == [threading.current_thread().name]
    finally:
        views.close()


def test_without_the_settings_nothing_is_made_ahead_or_page_locked(monkeypatch):
    """``populate`` and ``page_lock`` off (a pool whose process did not opt in, dz_gym.host_process): a reserve
    makes nothing, the first alloc makes the segment, and CUDA's registration is never called, CUDA up or not."""
    import dz_gym.transport.workers.views as host_views

    class Runtime:
        def cudaHostRegister(self, address, size, flags):  # noqa: N802
            raise AssertionError("page-locked without page_lock")

    monkeypatch.setattr(host_views, "_cudart", lambda: Runtime())
    views = HostViews(create_segment, lambda k, name: None, capacity=2**30)
    try:
        assert views.reserve(FIRST_VIEWS_SEGMENT_BYTES) and views.reserve(FIRST_VIEWS_SEGMENT_BYTES, wait=False)
        assert views.names == [] and views._preparing is None
        assert views.alloc(1000) is not None and len(views.names) == 1 and not views.pinned
    finally:
        views.close()
    assert not views.reserve(1000)


@pytest.mark.parametrize("wait", [True, False])
def test_a_segment_that_cannot_be_set_up_is_unlinked_and_gives_no_room(monkeypatch, caplog, wait):
    """Pages that cannot be mapped (here: no memory) unlink the segment; waiting, the reserve says there is no
    room; not waiting, it has started, the failure shows when the segment is taken and the alloc makes one
    of its own."""
    import errno
    import os

    import dz_gym.transport.workers.views as host_views

    made: list[str] = []

    def create(size):
        memory = create_segment(size)
        made.append(memory.name)
        return memory

    def refuse(address, size):
        raise OSError(errno.ENOMEM, "no memory to populate")

    monkeypatch.setattr(host_views, "_populate", refuse)
    views = HostViews(create, lambda k, name: None, capacity=2**30, populate=True)
    try:
        with caplog.at_level("WARNING", logger="dz_gym.transport"):
            assert views.reserve(1000, wait=wait) is not wait
            if not wait:
                assert views.alloc(1000) is not None and len(views.names) == 1
        assert made and len(views.names) == (0 if wait else 1)
        assert "could not be made" in caplog.text and "no memory to populate" in caplog.text
        assert not os.path.exists("/dev/shm/" + made[0].lstrip("/")), "the segment was unlinked"
        monkeypatch.undo()
        assert views.alloc(1000) is not None, "a later segment still can be made"
    finally:
        views.close()


# ------------------------------------------------------------------------------------- the pool's path
def test_requests_whose_views_lie_in_the_view_memory_are_sent_by_reference():
    frames: list[bytes] = []
    with recording_server(frames) as server, ProcessSessionPool(server.url, 6, FAST, processes=2) as pool:
        pool.connect()
        views = pool.host_views
        assert views is not None and views.blocks == 0
        block = views.alloc(6 * int(np.prod(VIEW)))
        images = views_of(block, 6)
        for k in range(6):
            images[k] = (7 * k) % 256
        requests = {k: request(k, images[k]) for k in range(6)}
        expected = sorted(packb(r) for r in requests.values())
        futures = pool.submit_many(list(requests.items()))
        concurrent.futures.wait(futures, timeout=BOUND_S)
        assert all(f.done() and f.result().ok for f in futures)
        assert all(not w.arena for w in pool._workers), "nothing went through an arena"
        assert all(f.result().request_bytes == len(packb(requests[k])) for k, f in enumerate(futures))
        assert views.blocks == 1  # the caller still holds its arrays
        del block, images, requests
        gc.collect()
        assert views.blocks == 0
        names = pool.shared_memory_names()
        assert len(names) == 1
        from dz_gym.eval.clients import RequestFields

        fields = RequestFields(pool, num_inference_steps=4)
        assert fields.host_memory == pool.host_memory  # fields added, views kept
        assert fields.reserve_host_memory(1000) and pool.shared_memory_names() == names  # room there already
    assert sorted(frames) == expected


def test_by_reference_and_copied_requests_keep_one_sessions_order():
    frames: list[bytes] = []
    with recording_server(frames) as server, ProcessSessionPool(server.url, 2, FAST, processes=2) as pool:
        pool.connect()
        block = pool.host_views.alloc(2 * int(np.prod(VIEW)))
        shared = views_of(block, 2)
        shared[0], shared[1] = 11, 33
        own = np.full(VIEW, 22, dtype=np.uint8)
        order = [request(0, shared[0]), request(0, own), request(0, shared[1])]
        futures = pool.submit_many([(0, r) for r in order])
        concurrent.futures.wait(futures, timeout=BOUND_S)
        assert all(f.result().ok for f in futures)
        assert len(pool._workers[0].arena) == 1, "the own-memory request went through the arena"
    assert frames == [packb(r) for r in order]


@pytest.mark.parametrize("inline_message_bytes", [None, 1])  # one message, or one ended by each inline request
def test_send_messages_keep_a_sessions_order_through_the_arena_inline_and_by_reference(
    monkeypatch, inline_message_bytes
):
    """One session's requests by reference, into the arena, inline (the arena full: its one request is still
    in flight), by reference and inline again: ``send`` messages carry them in order (one, unless the inline
    bytes end one), the server gets them in that order, the arena's range is free at the outcome and the view
    blocks once the worker took them."""
    if inline_message_bytes is not None:
        monkeypatch.setattr(handle, "INLINE_MESSAGE_BYTES", inline_message_bytes)
    frames: list[bytes] = []
    nbytes = int(np.prod(VIEW))
    with (
        recording_server(frames) as server,
        ProcessSessionPool(server.url, 1, FAST, processes=1, arena_bytes=256 * 1024) as pool,
    ):
        pool.connect()
        worker = pool._workers[0]
        sent: list[list] = []
        write = worker._write
        worker._write = lambda message: sent.append(message) or write(message)
        block = pool.host_views.alloc(2 * nbytes)
        shared = views_of(block, 2)
        shared[0], shared[1] = 11, 44
        own = [np.full(VIEW, value, dtype=np.uint8) for value in (22, 33, 55)]
        order = [request(0, shared[0]), request(0, own[0]), request(0, own[1]), request(0, shared[1]),
                 request(0, own[2])]  # fmt: skip
        futures = pool.submit_many([(0, r) for r in order])
        concurrent.futures.wait(futures, timeout=BOUND_S)
        assert all(f.done() and f.result().ok for f in futures)
        assert [f.result().request_bytes for f in futures] == [len(packb(r)) for r in order]
        sends = [message[1] for message in sent if message[0] == SEND.name]
        assert len(sends) == (1 if inline_message_bytes is None else 2)
        shapes = [[bytes if isinstance(p, bytes) else p[0] for p in parts] for send in sends for _, _, parts in send]
        assert shapes == [[bytes, VIEWS, bytes], [ARENA], [bytes], [bytes, VIEWS, bytes], [bytes]]
        assert worker.arena.segments[0].extents.allocated == 0, "the arena's range is free again"
        assert pool.host_views.blocks == 1  # the caller still holds its arrays
        expected = [packb(r) for r in order]
        del block, shared, order
        gc.collect()
        assert pool.host_views.blocks == 0, "the worker took the views of both"
    assert frames == expected


def batch_in(block: np.ndarray | None, env_ids: list[int], num_envs: int):
    """A RequestBatch of ``env_ids`` whose three views lie in ``block`` (own memory where it is None)."""
    from dz_gym.envs import droid
    from dz_gym.requests import assemble_requests

    count = len(env_ids)
    block = np.empty(3 * count * int(np.prod(VIEW)), np.uint8) if block is None else block
    cams = block.reshape(3, count, *VIEW)
    for j in range(3):
        for row in range(count):
            cams[j, row] = (31 * j + 7 * row) % 256
    views = dict(zip(droid.CAMERA_KEYS, cams))
    joints = np.arange(num_envs * 7, dtype=np.float64).reshape(num_envs, 7) / 100
    gripper = np.linspace(0, 1, num_envs).reshape(num_envs, 1)
    prompts = [f"put the cube in bowl {k}" for k in range(num_envs)]
    sessions = [f"episode-{k}-" + "x" * (k * 20) for k in range(num_envs)]
    return assemble_requests(views, joints, gripper, env_ids, prompts=prompts, session_ids=sessions)


@pytest.mark.parametrize(("processes", "in_view_memory"), [(0, False), (2, False), (2, True)])
def test_a_batchs_requests_are_framed_from_its_template(processes, in_view_memory):
    from dz_gym.transport import SessionPool

    frames: list[bytes] = []
    env_ids = [5, 0, 3, 2, 1]
    with recording_server(frames) as server:
        pool = ProcessSessionPool(server.url, 6, FAST, processes=2) if processes else SessionPool(server.url, 6, FAST)
        profiler = StageProfiler()
        pool.set_profiler(profiler)
        with pool:
            pool.connect()
            block = pool.host_views.alloc(3 * 5 * int(np.prod(VIEW))) if in_view_memory else None
            batch = batch_in(block, env_ids, 6)
            want = {k: packb(batch[k]) for k in env_ids}
            futures = pool.submit_batch(batch, env_ids)
            concurrent.futures.wait(futures, timeout=BOUND_S)
            outcomes = [f.result() for f in futures]
            assert all(o.ok for o in outcomes) and [o.index for o in outcomes] == env_ids
            assert [o.request_bytes for o in outcomes] == [len(want[k]) for k in env_ids]
            if processes:
                arenas = [len(w.arena) for w in pool._workers]
                assert all(not a for a in arenas) if in_view_memory else any(arenas)
                as_dicts = profiler.report(1.0)["batches_as_dicts"]  # the profile says why a batch went as dicts
                assert as_dicts == ({} if in_view_memory else {"views outside the view memory": 1})
                assert not any(p.kind is TOOK for w in pool._workers for p in w.pending.values()), "both took"
            if in_view_memory:
                assert pool.host_views.blocks == 1  # the caller still holds its arrays
                del block, batch
                gc.collect()
                assert pool.host_views.blocks == 0
    assert sorted(frames) == sorted(want.values())


# ---------------------------------------------------------------------------------- where views land
def test_to_host_lands_every_camera_in_the_given_block_and_falls_back_without_room():
    torch = pytest.importorskip("torch")
    from dz_gym.requests import _to_host

    rng = np.random.default_rng(0)
    cams = {c: [torch.from_numpy(rng.integers(0, 255, (n, 4, 6, 3), dtype=np.uint8)) for n in (2, 3)]
            for c in ("a", "b", "c")}  # fmt: skip
    expected = {c: np.concatenate([b.numpy() for b in blocks]) for c, blocks in cams.items()}
    given: list[np.ndarray] = []

    def host_memory(nbytes):
        given.append(np.zeros(nbytes, np.uint8))
        return given[-1]

    out = _to_host(cams, host_memory)
    assert len(given) == 1 and given[0].nbytes == sum(e.nbytes for e in expected.values())
    for camera, array in out.items():
        np.testing.assert_array_equal(array, expected[camera])
        assert array.flags.c_contiguous and np.shares_memory(array, given[0])
    fallback = _to_host(cams, lambda nbytes: None)
    for camera, array in fallback.items():
        np.testing.assert_array_equal(array, expected[camera])
        assert not np.shares_memory(array, given[0])


@pytest.mark.parametrize("opted_in", [False, True])
def test_the_wrapper_builds_the_pool_its_transport_asks_for_and_its_views_go_by_reference(opted_in):
    """The wrapper's own pool (nothing done to this process) makes its view memory at the first step; a pool
    given the evaluator's settings (dz_gym.host_process) makes it ready at reset."""
    pytest.importorskip("torch")
    from dz_gym.host_process import HostProcessSettings
    from dz_gym.server.launch import start_server_thread
    from dz_gym.testing.isaac_standin import IsaacDroidStandIn
    from dz_gym.transport import open_pool
    from dz_gym.wrapper import DreamZeroPolicyWrapper

    config = TransportConfig(open_timeout=5, request_timeout=30, close_timeout=2, connect_retries=0, processes=2)
    with start_server_thread("hold") as server:
        url = server.url + "/v1/realtime/robot/openpi"  # a per-session server (vLLM-Omni's path)
        source = {"client": open_pool(url, 4, config, host=HostProcessSettings())} if opted_in else {
            "server": url, "transport": config}  # fmt: skip
        env = DreamZeroPolicyWrapper(IsaacDroidStandIn(scene=1, num_envs=4), **source)
        try:
            pool = env.client
            assert type(pool) is ProcessSessionPool and pool.processes == 2 and pool.host_memory is not None
            env.reset(seed=0)
            assert bool(pool.host_views.names) == opted_in and pool.host_views.blocks == 0, "ready at reset"
            env.step()
            reserved = pool.host_views.names
            for _ in range(2):
                env.step()
            assert reserved and pool.host_views.names == reserved, "the steps found it ready"
            stats = [env.episode_stats(i) for i in range(4)]
            assert all(s.chunks >= 1 and not s.flagged for s in stats)
            assert all(not w.arena for w in pool._workers), "the views went by reference, not through an arena"
            assert pool.host_views.names
        finally:
            env.close()


def test_host_views_are_gathered_into_the_given_block():
    from dz_gym.requests import resized_views

    policy = {c: np.random.default_rng(k).integers(0, 255, (5, *VIEW), dtype=np.uint8)
              for k, c in enumerate(("external_cam", "external_cam_2", "wrist_cam"))}  # fmt: skip
    given: list[np.ndarray] = []

    def host_memory(nbytes):
        given.append(np.zeros(nbytes, np.uint8))
        return given[-1]

    env_ids = [4, 0, 1, 3]
    out = resized_views(policy, env_ids, None, host_memory=host_memory)
    plain = resized_views(policy, env_ids, None)
    assert len(given) == 1
    for camera, array in out.items():
        np.testing.assert_array_equal(array, plain[camera])
        assert np.shares_memory(array, given[0]) and array.flags.c_contiguous


def test_views_bytes_is_a_full_rounds_views_as_resized_views_returns_them():
    from dz_gym.requests import resized_views, views_bytes

    policy = {c: np.zeros((5, 36, 64, 3), np.uint8) for c in ("external_cam", "external_cam_2", "wrist_cam")}
    for resolution in (None, (18, 32), (20, 20)):
        out = resized_views(policy, range(5), resolution)
        assert views_bytes(policy, resolution) == sum(a.nbytes for a in out.values())
    torch = pytest.importorskip("torch")
    tensors = {c: torch.from_numpy(a) for c, a in policy.items()}
    assert views_bytes(tensors, (18, 32)) == 3 * 5 * 18 * 32 * 3


def test_a_client_without_host_memory_reserves_nothing():
    from dz_gym.server.policies import HoldPolicy
    from dz_gym.testing.memory_client import MemoryPolicyClient

    client = MemoryPolicyClient(HoldPolicy(), num_envs=2)
    assert client.host_memory is None and client.reserve_host_memory(10**6) is False


@pytest.mark.parametrize("as_batch", [False, True])
def test_a_killed_workers_requests_fail_and_their_blocks_come_back(as_batch):
    import os
    import signal

    from dz_gym.errors import ConnectionLost
    from dz_gym.server.launch import start_server_thread
    from dz_gym.server.policies import load_policy
    from dz_gym.testing.gated import GatedPolicy

    gated = GatedPolicy(load_policy("hold"), free=0)
    with start_server_thread(gated) as server, ProcessSessionPool(server.url, 4, FAST, processes=2) as pool:
        pool.connect()
        if as_batch:  # framed by the workers from the batch's template
            block = pool.host_views.alloc(3 * 4 * int(np.prod(VIEW)))
            images = batch_in(block, [0, 1, 2, 3], 4)
            futures = pool.submit_batch(images, [0, 1, 2, 3])
        else:
            block = pool.host_views.alloc(4 * int(np.prod(VIEW)))
            images = views_of(block, 4)
            futures = pool.submit_many([(k, request(k, images[k])) for k in range(4)])
        gated.held.wait(BOUND_S)
        os.kill(pool.worker_pid(1), signal.SIGKILL)
        for k in (1, 3):
            assert isinstance(futures[k].result(BOUND_S).error, ConnectionLost)
        gated.open()
        assert futures[0].result(BOUND_S).ok and futures[2].result(BOUND_S).ok
        del block, images
        gc.collect()
        assert pool.host_views.blocks == 0
        pool.reconnect(1)  # a fresh worker maps the view segments it is started with
        again = pool.host_views.alloc(int(np.prod(VIEW)))
        again[:] = 5
        outcome = pool.submit(1, request(1, views_of(again, 1)[0])).result(BOUND_S)
        assert outcome.ok and not pool._workers[1].arena
