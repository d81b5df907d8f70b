"""``dpsql.dbapi``: the PEP 249 driver, under the name users import.

The driver lives in :mod:`dpsql.interfaces.dbapi`; this module makes ``import dpsql.dbapi``
(and ``from dpsql import dbapi``) give exactly that module object, so the public name
stays stable while the code sits with the other interfaces.
"""

import sys

from dpsql.interfaces import dbapi as _dbapi

sys.modules[__name__] = _dbapi
