"""The one interface every mechanism implements, and the values that cross it.

A mechanism (matrix mechanism under Gaussian or Laplace noise, answers from past releases,
accuracy-first, MWEM, d_X Laplace, d_X MWEM, d_X SmallDB) is a ``plan(ask, public)``
function that returns a :class:`Plan`. The plan says, from public inputs only, what the
release costs (:class:`Cost`), how accurate it is expected to be (its
:class:`~dpsql.store.results.Explanation`) and what the returned
:class:`~dpsql.store.results.Release` reports; then

- ``plan.measure(handle)`` measures through the kernel handle it is given
  (:class:`dpsql.release.path.KernelHandle`: the kernel bound to this release's charge),
- ``plan.infer(measurements)`` turns the measurements into :class:`Answers` (answers and
  standard errors per statement).

Mechanisms never write result tables nor touch the ledger: :mod:`dpsql.release.path` runs
every one of them through the same steps (plan → check result names → check-and-charge →
measure → infer → write) under one guard.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dpsql.noise.accounting import PrivacyCost
from dpsql.policy.policy import TablePolicy
from dpsql.sql.compile import Workload
from dpsql.sql.parse import parse_batch
from dpsql.errors import UnknownTableError
from dpsql.store.results import check_result_names
from dpsql.release.support import _flags


@dataclass(frozen=True)
class Ask:
    """A request as the release path and the mechanisms see it: the validated
    :class:`~dpsql.request.value.Request` (the one settings value; every check on the settings
    ran when it was built) and whether it is released or only explained. ``dpsql.request``
    sits above this layer (the session builds the Request), so it is read, not imported."""

    request: object                  # a dpsql.request.value.Request, already validated
    release: bool = True             # False: explain (plan only, nothing is prepared)

    @property
    def sql(self):
        return self.request.sql

    @property
    def text(self) -> str:
        """The SQL as recorded in the ledger."""
        sql = self.request.sql
        return sql if isinstance(sql, str) else ";\n".join(sql)

    @property
    def epsilon(self):
        """Fraction; None when the request asks by accuracy (``objective``)."""
        return self.request.epsilon

    @property
    def delta(self):
        return self.request.delta

    @property
    def strategy(self) -> str:
        return self.request.strategy

    @property
    def calibration(self) -> str:
        return self.request.calibration

    @property
    def model(self) -> str:
        return self.request.model

    @property
    def objective(self) -> tuple | None:
        """``("rmse" | "max_stderr", target)``: accuracy first; else None."""
        return self.request.objective

    @property
    def replace(self) -> bool:
        return self.request.replace

    @property
    def name(self) -> str | None:
        return self.request.name

    @property
    def nonnegative(self) -> bool:
        return self.request.nonnegative

    @property
    def integer(self) -> bool:
        return self.request.integer

    @property
    def reuse(self) -> bool:
        return self.request.reuse

    @property
    def confirm(self) -> bool:
        return self.request.confirm

    @property
    def flags(self) -> dict:
        """Post-processing flags as recorded with a request (absent when off; ``reuse`` is
        not part of "the same request")."""
        return _flags(self.nonnegative, self.integer)


@dataclass(frozen=True)
class Public:
    """The public inputs of planning: the connection (policies, strategy cache, stored
    measurements of past releases; never the protected table) and the sampler's kind."""

    con: object
    policies: dict
    private: bool = True
    #: the past releases answers may be built from (reuse); None: every release of the
    #: table. The server gives each analyst only the releases charged to them.
    reuse_from: frozenset | None = None

    def parse(self, sql) -> tuple[TablePolicy, list]:
        """The batch's protected table and its queries (remembered: public inputs only)."""
        return parse_request(sql, self.policies)

    def compile(self, sql) -> tuple[TablePolicy, list, Workload]:
        return compile_request(sql, self.policies)


def parse_request(sql, policies) -> tuple[TablePolicy, list]:
    """The batch's protected table and its queries (allow-list parse; remembered), its
    result names checked (:func:`~dpsql.store.results.check_result_names`): planning, so
    before any charge, in explain and answer alike."""
    def resolve(name, node):
        if name not in policies:
            from dpsql.sql.refusals import _position
            line, col = _position(node)
            known = ", ".join(sorted(policies)) or "none yet; see protect()"
            raise UnknownTableError(
                f"table {name!r} is not a protected table (protected: {known})", line, col)
        return policies[name]

    from dpsql.sql import memo     # parsed batches are remembered (public inputs only)

    queries = memo.parsed(memo.batch_key(sql, policies), lambda: parse_batch(sql, resolve))
    check_result_names(queries, policies)
    from dpsql.sql import bigquery      # privacy_unit_column must be the declared unit

    bigquery.check_unit(sql, policies[queries[0].table])
    return policies[queries[0].table], queries


def compile_request(sql, policies) -> tuple[TablePolicy, list, Workload]:
    """The batch's table, queries and compiled workload (remembered; immutable)."""
    from dpsql.sql import memo     # compiled batches are remembered (immutable workloads)

    policy, queries = parse_request(sql, policies)
    return policy, queries, memo.compiled(memo.batch_key(sql, policies), queries, policy)


@dataclass(frozen=True)
class Cost:
    """What a release costs and how it is made, as the ledger records it (the path adds the
    SQL, result names, release name and the sampler's kind)."""

    cost: PrivacyCost                # standard (ε, δ); 0 for metric releases
    mechanism: str
    strategy: str
    n_queries: int
    n_cells: int
    params: dict                     # the request as asked (recorded as JSON, for replays)
    calibration: str | None = None
    sigma: float | None = None
    sensitivity: float | None = None
    rho: float | None = None
    expected_rmse: float | None = None
    bound_ratio: float | None = None
    metric_epsilon: object = None    # d_X: ε per unit distance, charged to the metric budget
    reused_from: str | None = None   # past releases whose measurements the answers combine


@dataclass(frozen=True)
class Shown:
    """What the returned :class:`~dpsql.store.results.Release` reports."""

    epsilon: float
    delta: float
    strategy: str
    sigma: float = math.nan
    expected_rmse: float = math.nan


@dataclass
class Answers:
    """What ``infer`` returns: per statement, in order, ``(output, answers, stderr,
    halfwidth)`` indexed like the output's rows of ``W``; the result tables' comment; and the
    measurements kept for later batches to reuse (a record, or a list of a release's pieces:
    :mod:`dpsql.mechanisms.reuse.records`; None: nothing kept)."""

    parts: list
    comment: str | None = None
    record: object = None


@dataclass
class Plan:
    """A mechanism's plan (public inputs only). Subclasses implement ``measure`` and
    ``infer``; nothing here reads data."""

    policy: TablePolicy
    queries: list                    # the batch's statements (their result names)
    explanation: object              # Explanation: expected error, candidates
    cost: Cost
    shown: Shown

    def measure(self, handle):       # pragma: no cover - interface
        raise NotImplementedError

    def infer(self, measurements) -> Answers:   # pragma: no cover - interface
        raise NotImplementedError


@dataclass
class FreePlan(Plan):
    """Every answer comes from past releases: nothing is measured, nothing is spent; the
    release is still recorded (at zero cost) and its tables written like any other. The
    planner computes ``answers`` before the charge (public: released measurements only)."""

    answers: Answers | None = None

    def measure(self, handle):
        handle.charge_only()
        return None

    def infer(self, measurements) -> Answers:
        return self.answers
