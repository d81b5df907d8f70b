"""The selection cache: every candidate's ε-free results for a workload, in the database.

A repeated request (same workload, same candidates) should not redo what
:func:`dpsql.mechanisms.selection.select` computed the first time: the singular value bound (an
eigendecomposition), every candidate's plan and least-squares factorisation, its error
factors. All of those are public (functions of ``W``, the strategy and its options, never
of data), and none depends on ε, δ or the calibration: a candidate's error factors are per
unit of noise variance, and its noise scale follows from its sensitivity and number of
measurements at the request's ε and δ. So one entry serves every ε, δ and calibration, and a
hit rebuilds the identical :class:`~dpsql.store.results.Explanation` (same numbers, bit for bit)
by the same arithmetic, without any factorisation.

Table ``dpsql.selection_cache`` (created and migrated by :mod:`dpsql.store.schema`, like
the other two here), one row per request shape:

- ``key``: SHA-256 of :data:`FORMAT`, the exact rows of ``W`` (:func:`workload_hash`), the
  domain shape, whether ``auto`` asked (it skips strategies over its time limit), and each
  candidate's noise family, canonical spec and options;
- ``workload_hash``, ``n_queries``, ``n_cells``: checked on load against the request;
- ``svdb``: the lower bound of ``W`` the selection used (the singular value bound, or the
  ``optimal`` plan's certified dual bound: :func:`dpsql.mechanisms.selection.certified_bound`);
- ``candidates``: JSON, per candidate: family, name, status (``ok``, ``skipped``, ``error``)
  and note, the plan's sensitivities, number of measurements and notes, and the key of its
  matrix in :mod:`dpsql.store.strategy_cache` (``null`` for the identity);
- ``factors``: float64 error factors (one per query) of every ``ok`` candidate, in order.

Table ``dpsql.solver_cache``: the lower Cholesky factor of ``AᵀA`` of a chosen plan (the
least-squares factorisation ``answer`` needs), by the plan's exact matrix (its strategy-cache
key and the digest of its stored bytes); stored only when recomputing it is dearer
(:func:`dpsql.mechanisms.selection.factor_worth_storing`), else a hit factorises again. Table ``dpsql.halfwidth_cache``: a Laplace
release's interval half-widths at unit noise scale, by exact matrix, workload and level
(:func:`dpsql.mechanisms.halfwidths.interval_halfwidths`).

Nothing loaded is trusted blindly. A row whose hash, shapes, lengths or values do not fit
the request is ignored and recomputed (and overwritten). The chosen candidate's matrix is
re-read from the strategy cache, where its sensitivities are recomputed exactly; if they
differ from the entry's, the entry is recomputed: the noise that protects a release is
always calibrated to the matrix that is measured. A Cholesky factor is used only after a
probe ``L Lᵀ v = Aᵀ A v`` (it affects accuracy, never privacy). The other candidates'
plans are :class:`PlanSummary` values: their public numbers without their matrices.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field

import duckdb
import numpy as np

from dpsql.store import schema
from dpsql.store.database import engine_errors
from dpsql.errors import StrategyError
from dpsql.sql.compile import workload_hash

#: bump when what an entry means changes (strategies' code, the entry layout)
FORMAT = "dpsql-selection-1"

@dataclass(frozen=True)
class PlanSummary:
    """A candidate's plan as the selection cache recorded it: its public numbers (enough to
    price it at any ε and δ), not its matrix. Only the chosen candidate's matrix is loaded;
    a summary is never released (``integral`` is False, and the kernel refuses it)."""

    strategy: str
    n: int
    n_measurements: int
    sensitivity: float
    l1_sensitivity: float
    notes: tuple = ()
    integral: bool = False

    @property
    def A(self):
        raise StrategyError(
            f"the matrix of strategy {self.strategy!r} was not loaded (this candidate came "
            "from the selection cache and was not chosen); ask for the strategy by name")


@dataclass(frozen=True)
class Evaluation:
    """One candidate, free of ε and δ: its plan (or why it has none) and error factors."""

    family: str
    name: str
    factors: np.ndarray | None = field(default=None, repr=False)  # None: not usable
    plan: object = field(default=None, repr=False)  # Plan, or PlanSummary from the cache
    note: str = ""
    seconds: float = 0.0
    cached: bool = False
    status: str = "ok"                               # ok, skipped, error
    plan_key: str | None = None                      # its matrix in the strategy cache
    solver: object = field(default=None, repr=False)
    digest: str | None = None                        # the matrix's, when this request stored it


def cached_hash(workload) -> str:
    """:func:`workload_hash` of ``workload.W``, remembered on the workload when ``W`` is
    read-only (as the compile memo leaves it), recomputed otherwise."""
    W = workload.W
    frozen = all(not getattr(W, a).flags.writeable for a in ("data", "indices", "indptr"))
    if frozen:
        known = getattr(workload, "_w_hash", None)
        if known is not None:
            return known
    h = workload_hash(W)
    if frozen:
        object.__setattr__(workload, "_w_hash", h)
    return h


def key(w_hash: str, shape: tuple, names, auto: bool, time_limit: float) -> str:
    """The entry's key: workload, shape, and the candidates asked for (module docstring)."""
    described = [[family, name, repr(getattr(obj, "options", None)),
                  type(obj).__module__ + "." + type(obj).__qualname__]
                 for family, name, obj in names]
    text = json.dumps([FORMAT, w_hash, list(shape), bool(auto),
                       float(time_limit) if auto else None, described])
    return hashlib.sha256(text.encode()).hexdigest()


# ------------------------------------------------------------------ entries
def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _notes_in(notes) -> tuple:
    return tuple(tuple(x) if isinstance(x, list) else x for x in notes)


def _notes_out(notes) -> list:
    return [list(x) if isinstance(x, tuple) else x for x in notes]


def load(con, entry_key: str, w_hash: str, workload, names) -> tuple | None:
    """``(svdb, [Evaluation])`` stored under ``entry_key``, or None when absent or when
    anything about it does not fit the request (then it is recomputed)."""
    with engine_errors("reading the selection cache"):
        schema.ensure(con)
        row = con.execute("SELECT workload_hash, n_queries, n_cells, svdb, candidates, "
                          "factors FROM dpsql.selection_cache WHERE key = ?",
                          [entry_key]).fetchone()
    if row is None:
        return None
    try:
        return _decode(row, w_hash, workload, names)
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


def _decode(row, w_hash: str, workload, names) -> tuple | None:
    stored_hash, m, n, total, text, blob = row
    if stored_hash != w_hash or m != workload.n_queries or n != workload.n_cells:
        return None
    if not _finite(total) or total < 0:
        return None
    items = json.loads(text)
    if not isinstance(items, list) or len(items) != len(names):
        return None
    if len(blob) % 8:
        return None
    factors = np.frombuffer(blob, dtype=np.float64)
    n_ok = sum(1 for it in items if isinstance(it, dict) and it.get("status") == "ok")
    if factors.size != n_ok * m or not np.all(np.isfinite(factors)):
        return None
    out, at = [], 0
    for (family, name, _), it in zip(names, items):
        if not isinstance(it, dict) or it.get("family") != family or it.get("name") != name:
            return None
        status, note = it.get("status"), it.get("note", "")
        if not isinstance(note, str):
            return None
        if status in ("skipped", "error"):
            out.append(Evaluation(family, name, note=note, cached=True, status=status))
            continue
        if status != "ok":
            return None
        p, s2, s1 = it["n_measurements"], it["sensitivity"], it["l1_sensitivity"]
        plan_key, notes = it.get("plan_key"), it.get("notes", [])
        if (not isinstance(p, int) or isinstance(p, bool) or p < 1 or not _finite(s2)
                or s2 <= 0 or not (_finite(s1) and s1 > 0 or s1 is None)
                or not isinstance(notes, list)
                or not (plan_key is None or isinstance(plan_key, str))):
            return None
        if family == "laplace" and s1 is None:
            return None
        summary = PlanSummary(name if it.get("plan_name") is None else it["plan_name"], n,
                              p, float(s2), math.nan if s1 is None else float(s1),
                              _notes_in(notes))
        out.append(Evaluation(family, name, factors[at:at + m], summary, cached=True,
                              plan_key=plan_key))
        at += m
    return float(total), out


def store(con, entry_key: str, w_hash: str, workload, total: float, evaluations) -> None:
    """Remember ``evaluations`` (and the singular value bound) under ``entry_key``."""
    items, blobs = [], []
    for e in evaluations:
        if e.factors is None:
            items.append({"family": e.family, "name": e.name, "status": e.status,
                          "note": e.note})
            continue
        s1 = e.plan.l1_sensitivity
        items.append({"family": e.family, "name": e.name, "status": "ok", "note": e.note,
                      "plan_name": e.plan.strategy,
                      "n_measurements": int(e.plan.n_measurements),
                      "sensitivity": float(e.plan.sensitivity),
                      "l1_sensitivity": float(s1) if math.isfinite(s1) else None,
                      "notes": _notes_out(e.plan.notes), "plan_key": e.plan_key})
        blobs.append(np.ascontiguousarray(e.factors, dtype=np.float64).tobytes())
    text = json.dumps(items, default=float)
    with engine_errors("writing the selection cache"):
        schema.ensure(con)
        schema.replace_row(con, "dpsql.selection_cache", dict(
            key=entry_key, workload_hash=w_hash, n_queries=int(workload.n_queries),
            n_cells=int(workload.n_cells), svdb=float(total), candidates=text,
            factors=b"".join(blobs)))


def same_numbers(plan, summary: PlanSummary) -> bool:
    """Whether a loaded plan has exactly the numbers the entry recorded for it."""
    s1, t1 = plan.l1_sensitivity, summary.l1_sensitivity
    return (plan.n == summary.n and plan.n_measurements == summary.n_measurements
            and plan.sensitivity == summary.sensitivity
            and (s1 == t1 or (math.isnan(s1) and math.isnan(t1))))


# ------------------------------------------------------------------ solver factors
def store_factor(con, solver_key: str, factor: np.ndarray) -> None:
    """Remember a chosen plan's lower Cholesky factor (upper triangle zeroed)."""
    L = np.tril(np.asarray(factor, dtype=np.float64))
    with engine_errors("writing the selection cache"):
        schema.ensure(con)
        schema.replace_row(con, "dpsql.solver_cache", dict(
            solver_key=solver_key, n=int(L.shape[0]), factor=L.tobytes()))


def factor_loader(con, solver_key: str, n: int):
    """A callable returning the stored ``(L, lower=True)`` for ``solver_key`` (a plan's
    exact matrix) or None; it is called at most once, and only if the solver is used
    (``answer``, not ``explain``)."""
    def load():
        try:
            row = con.execute("SELECT n, factor FROM dpsql.solver_cache WHERE solver_key = ?",
                              [solver_key]).fetchone()
        except duckdb.Error:
            return None
        if row is None or row[0] != n or len(row[1]) != 8 * n * n:
            return None
        return np.frombuffer(row[1], dtype=np.float64).reshape(n, n).copy(), True
    return load


def has_factor(con, solver_key: str) -> bool:
    with engine_errors("reading the selection cache"):
        schema.ensure(con)
        return con.execute("SELECT 1 FROM dpsql.solver_cache WHERE solver_key = ?",
                           [solver_key]).fetchone() is not None


# ------------------------------------------------------------------ interval half-widths
def halfwidth_key(solver_key: str, w_hash: str, level: float) -> str:
    text = json.dumps([FORMAT, "halfwidth", solver_key, w_hash, repr(float(level))])
    return hashlib.sha256(text.encode()).hexdigest()


def load_units(con, name: str, m: int) -> np.ndarray | None:
    """Stored unit-scale half-widths (``m`` finite values >= 0), or None."""
    with engine_errors("reading the selection cache"):
        schema.ensure(con)
        row = con.execute("SELECT n_queries, units FROM dpsql.halfwidth_cache WHERE key = ?",
                          [name]).fetchone()
    if row is None or row[0] != m or len(row[1]) != 8 * m:
        return None
    units = np.frombuffer(row[1], dtype=np.float64)
    return units if np.all(np.isfinite(units)) and np.all(units >= 0) else None


def store_units(con, name: str, units: np.ndarray) -> None:
    with engine_errors("writing the selection cache"):
        schema.ensure(con)
        schema.replace_row(con, "dpsql.halfwidth_cache", dict(
            key=name, n_queries=int(len(units)),
            units=np.ascontiguousarray(units, np.float64).tobytes()))
