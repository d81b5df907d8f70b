"""``python -m dpsql.interfaces.shell DB [options]``: the same as ``dpsql shell DB [options]``."""

import sys

from dpsql.interfaces.shell.app import main

sys.exit(main(sys.argv[1:]))
