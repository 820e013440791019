"""``dz-gym-eval``: the vectorized evaluator of a policy server on the DROID scenes.

Modules, in the order data flows: ``config`` (what a run is, its defaults and rules, and which settings change
results), ``preflight`` (backend and servers checked before anything is written), ``evaluate`` (the
programmatic entry point: scenes in turn, then the summary), ``capacity`` (resident-session and idle-timeout
warnings), ``runner`` (episode quotas, seeds, stepping the wrapped env), ``video`` (background mp4 writer),
``rundir`` (the run directory's files), ``results`` (rows, summary, Wilson intervals; pure), ``progress``
(terminal bars or periodic lines), ``signals`` (Ctrl-C/SIGTERM) and ``cli`` (the command line); ``shards``
runs the same episodes on a Ray cluster.
"""
