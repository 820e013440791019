"""``python -m dz_gym.server``: the same as ``dz-gym-serve``."""

import sys

from dz_gym.server.cli import main

sys.exit(main())
