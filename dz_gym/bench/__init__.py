"""``dz-gym-bench``: a throughput and latency tester for any OpenPI/DreamZero policy server.

Modules: ``payloads`` (pre-encoded DROID requests), ``load`` (closed-loop concurrency and open-loop request
rates over :class:`~dz_gym.transport.AsyncSession` connections), ``readiness`` (handshake and health probes),
``metrics`` (pure summaries), ``report`` (console, JSON, plot), ``runner`` (one benchmark end to end) and
``cli`` (the command). See ``docs/bench.md``.
"""
