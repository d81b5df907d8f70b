"""``python -m dpsql`` is the ``dpsql`` command."""

import sys

from dpsql.interfaces.cli import main

sys.exit(main())
