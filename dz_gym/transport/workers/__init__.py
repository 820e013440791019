"""The transport's worker processes: :class:`~dz_gym.transport.workers.pool.ProcessSessionPool`, the sessions
of a pool spread over worker processes that send their requests.

- :mod:`~dz_gym.transport.workers.pool` -- :class:`ProcessSessionPool`, the
  :class:`~dz_gym.policy_client.PolicyClient` (what the caller holds);
- :mod:`~dz_gym.transport.workers.handle` -- :class:`~dz_gym.transport.workers.handle.WorkerHandle`, this
  process's side of one worker: its process, pipe, shared memory and requests in flight;
- :mod:`~dz_gym.transport.workers.process` -- the worker process itself (its sessions on one asyncio loop);
- :mod:`~dz_gym.transport.workers.messages` -- what the two sides say to each other over the pipe (no I/O);
- :mod:`~dz_gym.transport.workers.segments` -- :class:`~dz_gym.transport.workers.segments.SharedSegments`,
  the one allocator of growing shared-memory segments (each worker's arena, the view memory);
- :mod:`~dz_gym.transport.workers.views` -- :class:`~dz_gym.transport.workers.views.HostViews`, the shared
  memory a GPU batch's views are copied to, which every worker reads directly.
"""

from __future__ import annotations

from dz_gym.transport.workers.pool import ProcessSessionPool

__all__ = ["ProcessSessionPool"]
