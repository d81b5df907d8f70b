"""The kernel's reads of the protected rows: the only module that imports :mod:`dpsql.engines`.

An import-linter contract in ``pyproject.toml`` keeps every other module, the kernel's own
included, from importing the engines. A read has two steps:

1. :func:`reader`, *before* the release's charge: the engine of the policy's source (the
   DuckDB control database, or Spark, whose session is started here if dpsql starts it),
   and the source's column names and types (the catalog only, never a value). A source that
   cannot be reached, or lost a declared column, is refused here: nothing is charged.
2. :func:`_data_vector` / :func:`_clique_marginals`, called by
   :mod:`dpsql.kernel.boundary` only after the charge is committed, so whatever happens once
   the data is touched has been paid for. Each refuses a table of 2**32 rows or more, for
   which the products ``A x`` would no longer be exact in float64 (the charge stays spent;
   nothing is released). :func:`_data_vectors` adds the per-cell sums of bounded values
   (SUM/AVG) to the counts, in the same scan.

Under user-level privacy (the policy's ``privacy_unit``) every read keeps at most
``max_rows_per_unit`` rows per unit (:func:`_cap`): the selection key is read from the
control database here, after the charge, and goes nowhere but into the engine's query,
which DuckDB and Spark evaluate alike (:mod:`dpsql.engines.query`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from types import ModuleType

import numpy as np

from dpsql.engines import duckdb as engine
from dpsql.engines import mapping, query
from dpsql.errors import EngineError, PolicyError, StrategyError, UnknownTableError
from dpsql.store import ledger
from dpsql.workload.matrix import EXACT_ROWS
from dpsql.workload.values import ValueBound


class SparkLink:
    """How the kernel reaches Spark: a session the caller gives (never stopped by dpsql),
    or one dpsql starts on first use from a master URL or a Spark Connect URL and stops in
    :meth:`close`. Thread-safe; one link may serve many sessions (the server's)."""

    def __init__(self, session=None, *, master: str | None = None,
                 remote: str | None = None):
        self._session, self.master, self.remote = session, master, remote
        self._owned = False
        self._lock = threading.Lock()

    def get(self):
        with self._lock:
            if self._session is None:
                from dpsql.engines import spark as spark_engine

                self._session, self._owned = spark_engine.open_session(self.master,
                                                                       self.remote)
            return self._session

    def close(self) -> None:
        with self._lock:
            if self._owned and self._session is not None:
                self._session.stop()
                self._session, self._owned = None, False


@dataclass(frozen=True)
class Reader:
    """One protected table as its engine reaches it, with its columns' types."""

    module: ModuleType      # dpsql.engines.duckdb or dpsql.engines.spark
    where: tuple            # the module's leading arguments: (con, table) or (spark, source, table)
    types: dict
    control: object = None  # the control database (the per-unit selection key lives there)

    def data_vector(self, columns, n_cells: int, cap=None) -> np.ndarray:
        return self.module.data_vector(*self.where, columns, n_cells, cap=cap,
                                       types=self.types)

    def data_vectors(self, columns, n_cells: int, sums, cap=None) -> tuple[np.ndarray, list]:
        return self.module.data_vectors(*self.where, columns, n_cells, sums, cap=cap,
                                        types=self.types)

    def marginals(self, columns, cliques, cap=None) -> dict:
        return self.module.marginals(*self.where, columns, cliques, cap=cap,
                                     types=self.types)


def source_columns(con, policy, spark: SparkLink | None) -> tuple[ModuleType, tuple, dict]:
    """The engine module, its leading arguments and the source's column names and types
    (catalog only). A Spark source without a way to reach Spark is refused."""
    if not policy.source.spark:
        return engine, (con, policy.table), engine.columns(con, policy.table)
    if spark is None:
        raise EngineError(
            f"table {policy.table!r} lives in Spark ({policy.source.label()}); connect with "
            "--spark-master URL or --spark-remote sc://HOST:PORT (Python: dpsql.connect(..., "
            "spark=SparkSession)); nothing was charged")
    from dpsql.engines import spark as spark_engine

    session = spark.get()
    where = (session, policy.source, policy.table)
    return spark_engine, where, spark_engine.columns(*where)


def unreadable(policy, types: dict) -> list[str]:
    """Why the source's columns cannot be read under their declared domains: missing
    columns, and (Spark) types whose reading would differ between engines."""
    unit = getattr(policy, "privacy_unit", None)
    missing = [c for c in [*policy.column_names, *([unit] if unit else [])] if c not in types]
    if missing:
        return [f"{policy.source.label() if policy.source.spark else 'the table'} has no "
                f"column(s) {missing} (it has {sorted(types)})"]
    if not policy.source.spark:
        return []
    found = (mapping.refusal(c, d, mapping.kind(types[c])) for c, d in policy.columns)
    return [r for r in found if r]


def reader(con, policy, spark: SparkLink | None) -> Reader:
    """Step 1, before the charge (module docstring): the source reached and checked."""
    module, where, types = source_columns(con, policy, spark)
    if not types and not policy.source.spark:
        raise UnknownTableError(f"there is no table {policy.table!r} in the database any "
                                "more; restore it (or protect the table again); nothing was "
                                "charged")
    problems = unreadable(policy, types)
    if problems:
        raise PolicyError(f"table {policy.table!r}: {'; '.join(problems)}; protect it again "
                          "once fixed; nothing was charged")
    return Reader(module, where, types, con)


def _reader_of(read, policy) -> Reader:
    """``read`` itself, or the DuckDB reader of a control-database connection (tests)."""
    return read if isinstance(read, Reader) else reader(read, policy, None)


def _columns(policy, workload) -> list:
    """Each used column with its declared domain and its units' parts (public)."""
    return [(p.column, policy.column(p.column), p.unit_to_part) for p in workload.partitions]


def _cap(read: Reader, policy) -> query.Cap | None:
    """The per-unit row cap of a user-level policy, or None (row-level privacy); its key is
    read here, after the charge."""
    if getattr(policy, "privacy_unit", None) is None:
        return None
    return query.Cap(policy.privacy_unit, int(policy.contribution),
                     ledger.unit_key(read.control, policy.table))


def _sum_of(value) -> query.Sum:
    """The engine's per-cell sum of a bounded value (:class:`~dpsql.sql.ir.Value`), in the
    whole units :class:`~dpsql.workload.values.ValueBound` derives from its bounds."""
    b = ValueBound(value.lo, value.hi)
    return query.Sum(value.column, b.exponent, b.lo_units, b.hi_units)


def _check_rows(rows: float) -> None:
    if rows >= EXACT_ROWS:
        raise StrategyError("the table is too large for exact products (2**32 rows or more); "
                            "this release was charged and nothing was released")


def _data_vector(read, policy, workload) -> np.ndarray:
    """The cell counts of a compiled workload (called only after the charge is committed)."""
    read = _reader_of(read, policy)
    x = read.data_vector(_columns(policy, workload), workload.n_cells, _cap(read, policy))
    _check_rows(x.sum())
    return x


def _data_vectors(read, policy, workload, values) -> tuple[np.ndarray, list]:
    """The cell counts and, per bounded value, its per-cell sums in whole units (int64), by
    one scan (called only after the charge is committed)."""
    read = _reader_of(read, policy)
    x, sums = read.data_vectors(_columns(policy, workload), workload.n_cells,
                                [_sum_of(v) for v in values], _cap(read, policy))
    _check_rows(x.sum())
    return x, sums


def _clique_marginals(read, policy, workload, cliques) -> dict:
    """The marginals of ``cliques`` over the columns' declared parts, by one engine scan
    (``GROUPING SETS``: every part present, zeros included; called only after the charge is
    committed)."""
    read = _reader_of(read, policy)
    counts = read.marginals(_columns(policy, workload), cliques, _cap(read, policy))
    _check_rows(max(float(T.sum()) for T in counts.values()))
    return counts
