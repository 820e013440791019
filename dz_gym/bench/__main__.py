"""``python -m dz_gym.bench`` runs the ``dz-gym-bench`` command."""

import sys

from dz_gym.bench.cli import main

sys.exit(main())
