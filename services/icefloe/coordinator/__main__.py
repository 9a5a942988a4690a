"""``python -m icefloe.coordinator [flags]``: the same as ``icefloe coordinator``."""

import sys

from icefloe.coordinator.service import main

sys.exit(main())
