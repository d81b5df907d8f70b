"""The kernel's reads of the protected rows: the only module that imports :mod:`dpsql.engines`.

An import-linter contract in ``pyproject.toml`` keeps every other module, the kernel's own
included, from importing the engines. A read has two steps:

1. :func:`reader`, *before* the release's charge: the engine of the policy's source (the
   DuckDB control database, or Spark, whose session is started here if dpsql starts it),
   and the source's column names and types (the catalog only, never a value). A source that
   cannot be reached, or lost a declared column, is refused here: nothing is charged.
2. :func:`_data_vector` / :func:`_clique_marginals`, called by
   :mod:`dpsql.kernel.boundary` only after the charge is committed, so whatever happens once
   the data is touched has been paid for. Both refuse a table of 2**32 rows or more, for
   which the products ``A x`` would no longer be exact in float64 (the charge stays spent;
   nothing is released).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from types import ModuleType

import numpy as np

from dpsql.engines import duckdb as engine
from dpsql.engines import mapping
from dpsql.errors import EngineError, PolicyError, StrategyError, UnknownTableError
from dpsql.workload.matrix import EXACT_ROWS


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

    def data_vector(self, columns, n_cells: int) -> np.ndarray:
        return self.module.data_vector(*self.where, columns, n_cells, types=self.types)

    def marginals(self, columns, cliques) -> dict:
        return self.module.marginals(*self.where, columns, cliques, types=self.types)


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
    missing = [c for c in policy.column_names if c not in types]
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
    return Reader(module, where, types)


def _columns(policy, workload) -> list:
    """Each used column with its declared domain and its units' parts (public)."""
    return [(p.column, policy.column(p.column), p.unit_to_part) for p in workload.partitions]


def _check_rows(rows: float) -> None:
    if rows >= EXACT_ROWS:
        raise StrategyError("the table is too large for exact products (2**32 rows or more); "
                            "this release was charged and nothing was released")


def _data_vector(read: Reader, policy, workload) -> np.ndarray:
    """The cell counts of a compiled workload (called only after the charge is committed)."""
    x = read.data_vector(_columns(policy, workload), workload.n_cells)
    _check_rows(x.sum())
    return x


def _clique_marginals(read: Reader, policy, workload, cliques) -> dict:
    """The marginals of ``cliques`` over the columns' declared parts, by one engine scan
    (``GROUPING SETS``: every part present, zeros included; called only after the charge is
    committed)."""
    counts = read.marginals(_columns(policy, workload), cliques)
    _check_rows(max(float(T.sum()) for T in counts.values()))
    return counts
