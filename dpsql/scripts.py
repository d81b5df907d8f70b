"""``dpsql.scripts``: SQL scripts for reporting jobs, under the name users import.

The code lives in :mod:`dpsql.interfaces.scripts`; this module makes ``import dpsql.scripts``
(and ``from dpsql import scripts``) give exactly that module object.
"""

import sys

from dpsql.interfaces import scripts as _scripts

sys.modules[__name__] = _scripts
