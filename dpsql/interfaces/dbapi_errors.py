"""The PEP 249 exception hierarchy of the DB-API driver (:mod:`dpsql.interfaces.dbapi`), and
the one boundary where dpsql's errors become those classes: the class each dpsql error
leaves as is the one :data:`dpsql.errors.ERROR_TABLE` names (:func:`error_class`)."""

from __future__ import annotations

import contextlib
import functools
from typing import Iterator

from dpsql import errors as dp


class Warning(Exception):  # noqa: A001 - the name is the PEP's
    """Important warnings (PEP 249). dpsql raises none today."""


class Error(Exception):
    """Base of every error this driver raises (PEP 249)."""


class InterfaceError(Error):
    """The driver itself was misused or failed, not the database."""


class DatabaseError(Error):
    """An error related to the database."""


class DataError(DatabaseError):
    """Problems with processed data (unused: dpsql never fails on a data value)."""


class OperationalError(DatabaseError):
    """The request could not be served now: budget exhausted, database busy."""


class IntegrityError(DatabaseError):
    """Relational integrity (unused: the driver never writes rows)."""


class InternalError(DatabaseError):
    """The database engine failed (its own message is withheld)."""


class ProgrammingError(DatabaseError):
    """The request is invalid: SQL outside the allow-list, bad parameters, closed objects."""


class NotSupportedError(DatabaseError):
    """The operation does not exist for dpsql (rollback)."""


class BudgetExceeded(OperationalError):
    """The release would exceed a budget; nothing was charged. Carries dpsql's exact figures."""

    table = quantity = spent = requested = limit = None


def error_class(error: BaseException | type) -> type:
    """The PEP 249 class for a dpsql error: the one :data:`dpsql.errors.ERROR_TABLE` names."""
    return globals()[dp.error_row(error).dbapi]


@contextlib.contextmanager
def _backend() -> Iterator[None]:
    """The boundary with dpsql: its errors leave as PEP 249 errors (the class the error
    table names), chained with ``from``."""
    try:
        yield
    except dp.RequestCancelled as exc:    # Connection.cancel(): nothing was charged
        raise error_class(exc)(str(exc)) from exc
    except dp.DpsqlError as exc:
        err = error_class(exc)(str(exc))
        if isinstance(exc, dp.BudgetExceededError):
            for attr in ("table", "quantity", "spent", "requested", "limit"):
                setattr(err, attr, getattr(exc, attr))
        raise err from exc


def check_closed(method):
    """Refuse any use of a closed connection or cursor (PEP 249: raise an Error)."""
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        if self.closed:
            raise ProgrammingError(f"{type(self).__name__} is closed; open a new one")
        return method(self, *args, **kwargs)
    return wrapper
