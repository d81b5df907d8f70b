"""The one release path: every mechanism goes plan → check result names → check-and-charge
→ measure → infer → write, here and nowhere else.

- :func:`explain` is the plan alone: it reads no data and spends nothing.
- :func:`answer` runs the whole path. Every refusal before the charge (the plan, the result
  names, the budget) writes nothing. The charge is committed by the kernel before any data
  is read (:class:`KernelHandle`: one charge per release). From the charge to the committed
  result tables, Ctrl-C and SIGTERM wait (:func:`~dpsql.release.support._interrupts_deferred`):
  a charged release is always completed, then :class:`InterruptedAfterRelease` reports it.
  A failure after the charge leaves the budget spent and the release ``charged`` (never a
  free re-noise); the result tables are written and the release marked ``released`` in one
  transaction, rolled back if anything in it fails.
- A named release asked again returns its recorded answers (:mod:`dpsql.release.named`).
- Planning runs without the database lock (the session's planning connection is let go
  before long steps; :mod:`dpsql.cancel`); :func:`answer` then holds the database for
  :func:`_locked_release`: re-validation (a release named meanwhile, the policy), result
  names, budget, check-and-charge, measure, infer, write. Until the charge a cancel
  (Ctrl-C, SIGTERM, ``Session.cancel()``) stops the request with nothing charged; from
  the charge on (:func:`dpsql.cancel.committed`) the release completes.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass

from dpsql import cancel

from dpsql.kernel.boundary import Kernel
from dpsql.mechanisms import catalog
from dpsql.errors import PolicyError, StrategyError, UnsupportedQueryError
from dpsql.release import adaptive, matrix, named
from dpsql.release.mechanism import Answers, Ask, Plan, Public
from dpsql.release.support import (InterruptedAfterRelease, _completed_on_interrupt,
                                   _interrupts_deferred)
from dpsql.store import database as engine
from dpsql.store import ledger
from dpsql.store.results import Release, ResultTable, build_columns, check_result_names
from dpsql.mechanisms.reuse import records


# ---------------------------------------------------------------------- which mechanism

def mechanism(ask: Ask):
    """The mechanism a request asks for: its ``plan(ask, public)`` function."""
    if ask.model == "metric":       # the Request checked the metric model's conditions
        return adaptive.DX[catalog.dx_strategy(ask.strategy)]
    if catalog.is_mwem(ask.strategy):
        return adaptive.plan_mwem
    return matrix.plan    # Gaussian or Laplace; answers from past releases; accuracy first


# ---------------------------------------------------------------------- the path

def explain(public: Public, ask: Ask):
    """The plan alone: expected accuracy and cost; reads no data, spends nothing."""
    return mechanism(ask)(ask, public).explanation


def check(public: Public, ask: Ask) -> None:
    """What adding a statement to a workload block (``BEGIN WORKLOAD``) asks of the block so
    far with it: that it parses, names one protected table and compiles onto its declared
    domain. No strategy is selected: explaining the whole block at every statement made a
    block quadratic (60 statements of a ``-f`` script took 52 s; 600 did not end in 10
    minutes). Its cost and accuracy are explained, and every other refusal made (nothing
    charged), when it is released."""
    from dpsql.release import implicit

    implicit.compile_for(ask, public)


def answer(public: Public, kernel: Kernel, ask: Ask, write=None, done: list | None = None,
           locked=None):
    """Release a batch (module docstring). ``write(con, receipt, plan, answers, ask)`` is the
    write step returning the :class:`~dpsql.store.results.Release` (default :func:`publish`;
    the session passes its own). ``done`` receives the Release once built, so that a caller
    holding more (the connection) still reports a Ctrl-C that lands after it. ``locked()``
    holds the database for the locked section (the session's ``Database.connect``; by
    default ``public.con`` is used as it is, already held)."""
    write = write or publish
    done = [] if done is None else done
    if ask.name is not None:
        recorded = ledger.find_named(public.con, ask.name)
        if recorded is not None:
            return named.recorded_answer(public.con, recorded, ask)
    plan = mechanism(ask)(ask, public)       # no lock held through its long steps
    cancel.check()
    with (locked() if locked is not None else contextlib.nullcontext(public.con)) as con:
        return _locked_release(con, public, kernel, ask, plan, write, done)


def _locked_release(con, public: Public, kernel: Kernel, ask: Ask, plan: Plan, write, done):
    """With the database held: re-check what the plan read unlocked (a named release, the
    policy), then result names, budget, check-and-charge, measure, infer, write."""
    if ask.name is not None:              # named meanwhile by another process?
        recorded = ledger.find_named(con, ask.name)
        if recorded is not None:
            return named.recorded_answer(con, recorded, ask)
    check_unchanged(con, plan.policy)
    names = result_names(con, plan.queries, check_targets(con, plan.queries,
                                                          public.policies, ask.replace))
    charge = _charge(plan, ask, names, kernel.private)
    _check_budget(con, plan)
    cancel.check()                        # the last point a cancel applies
    with cancel.committed(), _completed_on_interrupt(done):
        with _interrupts_deferred() as interrupted:
            handle = KernelHandle(kernel, con, plan.policy, charge)
            measurements = plan.measure(handle)
            receipt = handle.receipt()
            answers = plan.infer(measurements)
            done.append(write(con, receipt, plan, answers, ask))
        if interrupted:
            raise InterruptedAfterRelease(done[0], interrupted[0])
        return done[0]


def check_unchanged(con, policy) -> None:
    """Refuse (nothing charged) when the table's policy changed while the request was
    planned without the lock: the plan's domains or budget may no longer hold."""
    now = ledger.load_policies(con).get(policy.table.lower())
    if now != policy:
        raise PolicyError(
            f"the policy of table {policy.table!r} was changed (or removed) by another "
            "process while this request was being planned; nothing was charged; run the "
            "request again")


def _charge(plan: Plan, ask: Ask, names, private: bool) -> ledger.Charge:
    c = plan.cost
    return ledger.Charge(
        table=plan.policy.table, cost=c.cost, mechanism=c.mechanism, strategy=c.strategy,
        calibration=c.calibration, sigma=c.sigma, sensitivity=c.sensitivity, rho=c.rho,
        n_queries=c.n_queries, n_cells=c.n_cells, expected_rmse=c.expected_rmse,
        sql_text=ask.text, bound_ratio=c.bound_ratio, result_tables=names, private=private,
        release_name=ask.name, metric_epsilon=c.metric_epsilon,
        request=json.dumps(c.params), reused_from=c.reused_from)


def _check_budget(con, plan: Plan) -> None:
    """Refuse early what the budget cannot take (the charge re-checks, atomically)."""
    c = plan.cost
    if c.metric_epsilon is not None:
        ledger.check_metric(con, plan.policy, c.metric_epsilon)
    elif c.cost.epsilon != 0 or c.cost.delta != 0:
        ledger.check_fits(con, plan.policy, c.cost, c.mechanism, c.rho)


@dataclass(frozen=True)
class Receipt:
    """The committed charge of a release: its id, result table names, sampler kind."""

    release_id: int
    tables: list
    private: bool


class KernelHandle:
    """The kernel bound to one release (connection, policy, charge), given to ``measure``.

    Every kernel call charges first (committed before any data is read); a release makes
    exactly one. :meth:`charge_only` records a release that measures nothing (answers from
    past releases): the same charge, at its (zero) cost."""

    def __init__(self, kernel: Kernel, con, policy, charge: ledger.Charge):
        self._kernel, self._con, self._policy, self._charge = kernel, con, policy, charge
        self._receipt: Receipt | None = None

    def _once(self) -> None:
        if self._receipt is not None:
            raise StrategyError("internal error: a release is charged once")

    def _got(self, release_id, tables, private) -> None:
        self._receipt = Receipt(int(release_id), list(tables), bool(private))

    def receipt(self) -> Receipt:
        if self._receipt is None:
            raise StrategyError("internal error: the mechanism measured nothing and was "
                                "never charged")
        return self._receipt

    def release(self, workload, plan, sigma, *, mechanism: str):
        self._once()
        m = self._kernel.release(self._con, self._policy, workload, plan, sigma,
                                 self._charge, mechanism=mechanism)
        self._got(m.release_id, m.result_tables, m.private)
        return m

    def release_per_query(self, workload, scales):
        self._once()
        m = self._kernel.release_per_query(self._con, self._policy, workload, scales,
                                           self._charge)
        self._got(m.release_id, m.result_tables, m.private)
        return m

    def release_adaptive(self, blocks, epsilon, algorithm):
        self._once()
        release_id, tables, result, private = self._kernel.release_adaptive(
            self._con, self._policy, blocks, epsilon, self._charge, algorithm)
        self._got(release_id, tables, private)
        return result

    def release_adaptive_marginals(self, workload, candidates, epsilon, algorithm):
        self._once()
        release_id, tables, result, private = self._kernel.release_adaptive_marginals(
            self._con, self._policy, workload, candidates, epsilon, self._charge, algorithm)
        self._got(release_id, tables, private)
        return result

    def release_adaptive_metric(self, blocks, graphs, epsilon, algorithm):
        self._once()
        release_id, tables, result, private = self._kernel.release_adaptive_metric(
            self._con, self._policy, blocks, graphs, epsilon, self._charge, algorithm)
        self._got(release_id, tables, private)
        return result

    def charge_only(self) -> None:
        self._once()
        if self._charge.cost.epsilon != 0 or self._charge.cost.delta != 0 \
                or self._charge.metric_epsilon is not None:
            raise StrategyError("internal error: only a free release measures nothing")
        release_id, tables = ledger.charge(self._con, self._policy, self._charge)
        self._got(release_id, tables, self._kernel.private)


# ---------------------------------------------------------------------- result names

def check_targets(con, queries, policies, replace: bool) -> set:
    """The names given (lower case), once the existing tables allow them; the names
    themselves were checked while parsing (:func:`dpsql.store.results.check_result_names`)."""
    names = check_result_names(queries, policies)
    for q in queries:
        if q.target is not None and engine.table_exists(con, q.target):
            if not (replace or q.replace):
                raise UnsupportedQueryError(
                    f"table {q.target!r} already exists; use CREATE OR REPLACE TABLE or "
                    "replace=True to overwrite it")
            if not ledger.is_result_table(con, q.target):
                raise UnsupportedQueryError(
                    f"table {q.target!r} exists and was not created by dpsql; dpsql only "
                    "replaces its own result tables")
    return names


def result_names(con, queries, names_given):
    """Names of the result tables, as a function of the new release id."""
    def names(release_id: int) -> list[str]:
        out = []
        taken = engine.relation_names(con) | {n.lower() for n in names_given}
        for q in queries:
            if q.target is not None:
                out.append(q.target)
                continue
            name, k = f"dp_r{release_id}_q{q.index + 1}", 1
            while name.lower() in taken:
                k += 1
                name = f"dp_r{release_id}_q{q.index + 1}_{k}"
            out.append(name)
        return out
    return names


# ---------------------------------------------------------------------- write

def write_results(con, receipt: Receipt, policy, answers: Answers, replace: bool) -> list:
    """Write every statement's result table (one bulk write: :func:`dpsql.store.database.
    write_tables`), mark the release done and keep its measurements for reuse, in one
    transaction (rolled back if any of it fails)."""
    results = []
    with engine.engine_errors("writing results"):
        con.execute("BEGIN TRANSACTION")
    try:
        recorded, tables = [], []
        for name, (out, values, stderr, halfwidth, *interval) in zip(receipt.tables,
                                                                      answers.parts):
            cols = build_columns(out, policy, values, stderr, halfwidth, *interval)
            tables.append((name, cols, replace or out.query.replace
                           or out.query.target is None))
        engine.write_tables(con, tables, release=receipt.release_id,
                            comment=answers.comment)
        for (name, cols, _), (out, *_) in zip(tables, answers.parts):
            rows = list(zip(*[v for _, _, v in cols])) if cols else []
            results.append(ResultTable(name, tuple(c for c, _, _ in cols), rows))
            recorded.append((out.query.index, name, out.query.sql, len(rows)))
        ledger.mark_released(con, receipt.release_id, recorded)
        if answers.record is not None:     # kept for later batches to reuse (released)
            records.store(con, policy, answers.record, receipt.private)
        with engine.engine_errors("writing results"):
            con.execute("COMMIT")
    except BaseException:
        try:
            con.execute("ROLLBACK")
        except Exception:
            pass
        raise
    return results


def publish(con, receipt: Receipt, plan: Plan, answers: Answers, ask: Ask, make=Release):
    """The write step: the result tables (:func:`write_results`), then the Release (built
    by ``make``)."""
    results = write_results(con, receipt, plan.policy, answers, ask.replace)
    s = plan.shown
    return make(receipt.release_id, plan.policy.table, list(receipt.tables), s.epsilon,
                   s.delta, s.strategy, s.sigma, s.expected_rmse, results, receipt.private,
                   name=ask.name)
