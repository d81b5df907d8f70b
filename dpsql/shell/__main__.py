"""``python -m dpsql.shell DB [options]``: the same as ``dpsql shell DB [options]``."""

import sys

from .app import main

sys.exit(main(sys.argv[1:]))
