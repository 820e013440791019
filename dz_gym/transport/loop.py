"""A private asyncio event loop in a daemon thread (:class:`LoopThread`), for synchronous callers.

Synchronous code (and code whose own thread already runs a loop, such as Isaac Lab/Kit or Jupyter) drives
:class:`~dz_gym.transport.session.AsyncSession` objects through it without touching its own loop.

>>> import asyncio
>>> loop = LoopThread()
>>> async def add(a, b):
...     await asyncio.sleep(0)
...     return a + b
>>> loop.run(add(1, 2), timeout=5)
3
>>> loop.close()
>>> loop.closed
True
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import signal
import threading
import weakref
from collections.abc import Coroutine
from typing import Any, TypeVar

from dz_gym.errors import RequestTimeout

__all__ = ["CANCEL_GRACE_S", "LoopThread"]

_T = TypeVar("_T")

CANCEL_GRACE_S = 2.0
"""How long a cancelled coroutine may run its cleanup (e.g. dropping a connection) before the caller goes on."""


class LoopThread:
    """An asyncio event loop running in a daemon thread, for synchronous callers.

    It never touches the caller's own loop, so it works inside Isaac Lab/Kit, Jupyter or any thread that
    already runs a loop. ``close()`` cancels what is left, stops the loop and joins the thread; it is
    idempotent and also runs at interpreter exit.
    """

    def __init__(self, name: str = "dz-gym-transport"):
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        # The thread must not reference ``self``, so a forgotten LoopThread can be collected (and stopped).
        self._thread = threading.Thread(target=_run_loop, args=(self._loop, self._ready), name=name, daemon=True)
        self._thread.start()
        self._ready.wait()
        self._finalizer = weakref.finalize(self, _stop_loop, self._loop, self._thread)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    @property
    def thread_id(self) -> int | None:
        """The loop thread's ident."""
        return self._thread.ident

    def in_loop_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def submit(self, coro: Coroutine[Any, Any, _T]) -> concurrent.futures.Future[_T]:
        """Schedule ``coro`` on the loop; returns at once with a thread-safe future."""
        if self.closed:
            coro.close()
            raise RuntimeError("LoopThread is closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def submit_many(self, coros: list[Coroutine[Any, Any, _T]]) -> list[concurrent.futures.Future[_T]]:
        """:meth:`submit` for each of ``coros`` in one hand-off (one wake-up of the loop thread, however many
        there are); each future cancels its task when cancelled, as ``run_coroutine_threadsafe``'s do."""
        if self.closed:
            for coro in coros:
                coro.close()
            raise RuntimeError("LoopThread is closed")
        futures: list[concurrent.futures.Future[_T]] = [concurrent.futures.Future() for _ in coros]
        loop = self._loop

        def start() -> None:
            for coro, future in zip(coros, futures):
                if future.cancelled():
                    coro.close()
                    continue
                task = loop.create_task(coro)
                task.add_done_callback(functools.partial(_settle_future, future))
                future.add_done_callback(functools.partial(_cancel_task, loop, task))

        loop.call_soon_threadsafe(start)
        return futures

    def run(self, coro: Coroutine[Any, Any, _T], timeout: float | None) -> _T:
        """Run ``coro`` on the loop and wait for its result; past ``timeout`` it is cancelled and
        :class:`RequestTimeout` raised. Must not be called from the loop's own thread (it would deadlock)."""
        if self.in_loop_thread():
            coro.close()
            raise RuntimeError("LoopThread.run called from its own loop thread; await the coroutine instead")
        if self.closed:
            coro.close()
            raise RuntimeError("LoopThread is closed")
        finished = threading.Event()
        future = self.submit(_signal_when_done(coro, finished))
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            # Let the cancellation run its cleanup (e.g. dropping a session) before the caller goes on.
            finished.wait(CANCEL_GRACE_S)
            raise RequestTimeout(f"operation on the transport loop did not finish within {timeout:g} s") from None

    def close(self) -> None:
        """Cancel pending tasks, stop the loop and join its thread (idempotent)."""
        if self.in_loop_thread():
            raise RuntimeError("LoopThread.close called from its own loop thread")
        self._finalizer()


def _run_loop(loop: asyncio.AbstractEventLoop, ready: threading.Event) -> None:
    # Stop signals go to the main thread, which handles them: one that lands on this thread would leave a main
    # thread blocked on a reply unwoken until that reply came.
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    asyncio.set_event_loop(loop)
    loop.call_soon(ready.set)
    loop.run_forever()


async def _signal_when_done(coro: Coroutine[Any, Any, _T], finished: threading.Event) -> _T:
    try:
        return await coro
    finally:
        finished.set()


def _stop_loop(loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
    async def cancel_all() -> None:
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=2.0)
        await loop.shutdown_asyncgens()

    if thread.is_alive() and not loop.is_closed():
        try:
            asyncio.run_coroutine_threadsafe(cancel_all(), loop).result(5.0)
        except BaseException:  # noqa: BLE001 - shutting down: best effort
            pass
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5.0)
    if not thread.is_alive() and not loop.is_closed():
        loop.close()


def _settle_future(future: concurrent.futures.Future, task: asyncio.Task) -> None:
    """Copy a finished task's outcome into the caller's future (unless the caller cancelled it)."""
    if task.cancelled():
        future.cancel()
    elif not future.set_running_or_notify_cancel():
        return  # the caller cancelled it
    elif task.exception() is not None:
        future.set_exception(task.exception())
    else:
        future.set_result(task.result())


def _cancel_task(loop: asyncio.AbstractEventLoop, task: asyncio.Task, future: concurrent.futures.Future) -> None:
    if future.cancelled() and not loop.is_closed():
        loop.call_soon_threadsafe(task.cancel)
