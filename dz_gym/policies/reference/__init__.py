"""A classical, vision-based reference policy for the embedded DROID scenes (``dz-gym-serve --policy reference``).

It checks the evaluator end to end with a policy that really solves the tasks from what the protocol
carries (images, joints, gripper, prompt); it is not a learned model. Modules, in data-flow order:
``tasks`` (prompt -> what to look for), ``segmentation`` and ``geometry`` (pixels -> 3-D),
``perception`` (views -> tracked estimates), ``planner`` (phases, checks, retries -> Cartesian rows),
``motion`` (IK + safety -> joint rows), ``sessions`` (per-session state) and ``policy`` (the server plug-in).
"""

from dz_gym.policies.reference.policy import ReferencePolicy, make_reference_policy

__all__ = ["ReferencePolicy", "make_reference_policy"]
