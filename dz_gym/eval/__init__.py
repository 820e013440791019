"""``dz-gym-eval``: the vectorized evaluator of a policy server on the DROID scenes.

Modules, in the order data flows: ``config`` (what a run is, and which settings change results), ``runner``
(episode quotas, seeds, stepping the wrapped env), ``video`` (background mp4 writer), ``rundir`` (the run
directory's files), ``results`` (rows, summary, Wilson intervals; pure), ``progress`` (terminal bars) and
``cli`` (the command line).
"""
