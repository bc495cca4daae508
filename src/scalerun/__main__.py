"""``python -m scalerun`` is the same as the ``scalerun`` command."""

import sys

from scalerun.cli import main

sys.exit(main())
