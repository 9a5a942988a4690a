"""``python -m icefloe.cli``: the same as the ``icefloe`` command."""

import sys

from icefloe.cli.main import main

sys.exit(main())
