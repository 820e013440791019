"""Policies that dz-gym's own server (``dz-gym-serve``) can run.

``reference``: a classical, vision-based reference policy for the embedded DROID scenes
(:mod:`dz_gym.policies.reference`). It exists to check the evaluator end to end; it is not a learned model.
"""
