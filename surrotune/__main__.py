"""``python -m surrotune`` is the ``surrotune`` command."""

import sys

from surrotune.cli import main

sys.exit(main())
