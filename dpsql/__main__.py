"""``python -m dpsql`` is the ``dpsql`` command."""

import sys

from .cli import main

sys.exit(main())
