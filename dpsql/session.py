"""Orchestration: parse -> compile -> select -> (kernel) -> infer -> release.

``explain`` runs the public half of the pipeline only: it never reads data nor touches the
budget. ``answer`` validates everything (SQL, policy, privacy parameters, result names,
strategy, budget fit) before the kernel reads a single row, so a bad request charges nothing.
"""

from __future__ import annotations

import json
import math
from fractions import Fraction
from typing import Sequence


from dpsql.mechanisms import catalog as adaptive
from dpsql.store import database as engine
from dpsql.store import ledger
from dpsql.mechanisms import matrix as selection
from dpsql.mechanisms import reuse as reuse_mod
from dpsql.noise.accounting import PrivacyCost, fraction_from_text
from dpsql.errors import (DpsqlError, PolicyError, UnknownTableError, UnsupportedQueryError)
from dpsql.inference.least_squares import LeastSquares, consistent
from dpsql.kernel import Kernel
from dpsql.noise.gaussian import rounding_slack, zcdp_rho
from dpsql.policy.policy import TablePolicy, load_policy
from dpsql.store.results import Explanation, Release, ResultTable, build_columns, check_result_names
from dpsql.sql.compile import Workload
from dpsql.sql.parse import parse_batch
from dpsql.release.support import (InterruptedAfterRelease, _completed_on_interrupt, _flags,
                              _interrupts_deferred, _request_params, request_matches)
from dpsql.release.adaptive import AdaptivePaths
from dpsql.request import SETTINGS, Request

class Session(AdaptivePaths):
    """A dpsql connection to one DuckDB database. Create it with :func:`dpsql.connect`."""

    def __init__(self, path: str = ":memory:", *, lock_timeout: float = 30.0, sampler=None,
                 reuse: bool = True):
        """``reuse``: the default of :meth:`answer`'s and :meth:`explain`'s ``reuse``."""
        self.reuse = SETTINGS["reuse"].parse(reuse)
        self.db = engine.Database(path, lock_timeout=lock_timeout)
        self.kernel = Kernel(sampler)

    # ------------------------------------------------------------------ data owner
    def protect(self, table: str, policy, *, replace: bool = False) -> TablePolicy:
        """Declare ``table``'s public domains and budget (TOML path or dict); stored in the DB."""
        if not isinstance(table, str) or not table:
            raise PolicyError("protect() needs the table name as a string")
        tp = load_policy(policy, table)[table.lower()]
        with self.db.connect() as con:
            if not engine.table_exists(con, tp.table):
                raise UnknownTableError(f"there is no table {tp.table!r} in the database to "
                                        "protect; load the data first, or check the name")
            present = engine.table_columns(con, tp.table)
            missing = [c for c in tp.column_names if c not in present]
            if missing:
                raise PolicyError(
                    f"policy declares column(s) {missing} that table {tp.table!r} does not have "
                    f"(it has {sorted(present)})")
            ledger.save_policy(con, tp, replace=replace)
        return tp

    # ------------------------------------------------------------------ analyst
    def policies(self) -> dict[str, TablePolicy]:
        with self.db.connect() as con:
            return ledger.load_policies(con)

    def explain(self, sql: str | Sequence[str], *, epsilon=None, delta, strategy: str = "auto",
                calibration: str = "analytic", model: str = "dp", target_rmse=None,
                max_stderr=None, reuse: bool | None = None) -> Explanation:
        """Expected accuracy of a request: reads no data, spends nothing.

        With ``reuse`` (the session's default unless given) the explanation says which answers come free from past
        releases and what every answer's error is once old and new measurements combine.

        Accuracy first: give ``target_rmse`` (the batch's expected RMSE) or ``max_stderr``
        (every answer's standard error) instead of ``epsilon``, and the explanation is for
        the smallest ε (at this δ, three significant digits) that meets it."""
        r = Request(sql, epsilon=epsilon, delta=delta, strategy=strategy,
                    calibration=calibration, model=model, target_rmse=target_rmse,
                    max_stderr=max_stderr, reuse=self.reuse if reuse is None else reuse)
        strategy, calibration, model, reuse = r.strategy, r.calibration, r.model, r.reuse
        objective = r.objective
        if objective is not None:
            dlt = r.delta
            with self.db.connect() as con:
                policy, queries, workload = self._compile(sql, ledger.load_policies(con))
                return self._decide(con, policy, workload, None, dlt, strategy, calibration,
                                    objective, reuse).expl
        eps, dlt = r.epsilon, r.delta
        with self.db.connect() as con:
            policies = ledger.load_policies(con)
            if model == "metric":
                return self._explain_metric(policies, sql, eps, strategy)
            if adaptive.is_mwem(strategy):
                policy, queries = self._parse(sql, policies)
                return self._mwem_plan(policy, queries, eps, dlt, strategy)[0]
            policy, queries, workload = self._compile(sql, policies)
            return self._decide(con, policy, workload, eps, dlt, strategy, calibration, None,
                                reuse).expl

    def answer(self, sql: str | Sequence[str], *, epsilon=None, delta, strategy: str = "auto",
               calibration: str = "analytic", replace: bool = False,
               name: str | None = None, model: str = "dp", target_rmse=None,
               max_stderr=None, confirm: bool = False, nonnegative: bool = False,
               integer: bool = False, reuse: bool | None = None) -> Release:
        """Release noisy answers to a batch, charging (epsilon, delta) to the table's budget.

        ``name`` makes the release idempotent: asking again under the same name with the same
        SQL and parameters returns the recorded answers (no charge, no fresh noise); anything
        else under a used name is refused.

        ``delta = 0`` asks for pure ε-DP (Laplace noise, or ``strategy="mwem"``).
        ``model="metric"`` asks for a metric (d_X) release: ``epsilon`` is then ε per unit of
        the table's declared record distance, charged to its separate metric budget.

        Accuracy first: ``target_rmse=`` or ``max_stderr=`` instead of ``epsilon`` spends the
        smallest ε that meets the target (see :meth:`explain`), and only with
        ``confirm=True``; without it the cost is reported in the error and nothing is spent.

        Consistency (post-processing, no privacy cost): ``nonnegative=True`` answers from
        the cell estimates of non-negative least squares, ``integer=True`` rounds the
        answers. The standard errors and intervals still describe the unconstrained
        estimate; the result tables' comments say so.
        """
        r = Request(sql, epsilon=epsilon, delta=delta, strategy=strategy,
                    calibration=calibration, model=model, target_rmse=target_rmse,
                    max_stderr=max_stderr, confirm=confirm, nonnegative=nonnegative,
                    integer=integer, reuse=self.reuse if reuse is None else reuse, name=name,
                    replace=replace)
        strategy, calibration, model, reuse = r.strategy, r.calibration, r.model, r.reuse
        objective = r.objective
        eps, dlt = (Fraction(1) if objective else r.epsilon), r.delta
        text = sql if isinstance(sql, str) else ";\n".join(sql)
        flags = _flags(nonnegative, integer)   # reuse is not part of "the same request"
        done: list = []      # the Release, once built (a late Ctrl-C still reports it)
        with _completed_on_interrupt(done), self.db.connect() as con:
            if name is not None:
                recorded = ledger.find_named(con, name)
                if recorded is not None and objective is None:
                    return self._recorded(con, recorded, text, eps, dlt, strategy,
                                          calibration, model, flags)
                if recorded is not None:
                    return self._recorded_target(con, recorded, text, dlt, strategy,
                                                 calibration, model, flags, objective)
            policies = ledger.load_policies(con)
            if model == "metric":
                return self._answer_dx(con, policies, sql, text, eps, replace, name, strategy,
                                       done)
            if adaptive.is_mwem(strategy):
                return self._answer_mwem(con, policies, sql, text, eps, dlt, strategy,
                                         replace, name, done)
            policy, queries, workload = self._compile(sql, policies)
            names_given = self._check_targets(con, queries, policies, replace)
            d = self._decide(con, policy, workload, None if objective else eps, dlt, strategy,
                             calibration, objective, reuse)
            if objective is not None:
                eps = d.epsilon
                if d.new is not None and confirm is not True:
                    raise DpsqlError(
                        f"an expected {objective[0].replace('_', ' ')} of {objective[1]:g} "
                        f"needs epsilon = {float(eps):g} (delta = {float(dlt):g}, strategy "
                        f"{d.expl.strategy}); nothing was charged; pass confirm=True to spend "
                        "it")
            result_names = self._result_names(con, queries, names_given)
            params = json.dumps(_request_params(eps, dlt, strategy, calibration, "dp") | flags)
            if d.new is None:
                return self._answer_free(con, policy, workload, d, text, result_names, params,
                                         replace, name, nonnegative, integer, done)
            expl, new = d.expl, d.new
            best = next(c for c in new.candidates if c.strategy == new.strategy
                        and c.mechanism == new.mechanism)
            chosen = best.plan
            solver = None
            if d.pool is None:
                solver = best.solver or LeastSquares(chosen)
                halfwidth = selection.interval_halfwidths(con, expl, solver, workload)
            else:
                halfwidth = d.pool.halfwidths(workload.W, expl.stderr ** 2)
            cost = PrivacyCost(eps, dlt if new.mechanism == "gaussian" else 0)
            rho = _rho(new, eps, chosen)
            ledger.check_fits(con, policy, cost, new.mechanism, rho)
            request = ledger.Charge(
                table=policy.table, cost=cost, mechanism=new.mechanism,
                strategy=new.strategy,
                calibration=calibration if new.mechanism == "gaussian" else None,
                sigma=new.sigma, sensitivity=best.sensitivity, rho=rho,
                n_queries=workload.n_queries, n_cells=workload.n_cells,
                expected_rmse=expl.rmse, sql_text=text, bound_ratio=new.bound_ratio,
                result_tables=result_names, private=self.kernel.private, release_name=name,
                request=params, reused_from=_sources(d))
            with _interrupts_deferred() as interrupted:
                # from the charge to the committed result tables, Ctrl-C waits: a charged
                # release is always completed, never left half-written
                m = self.kernel.release(con, policy, workload, chosen, new.sigma, request,
                                        mechanism=new.mechanism)
                if d.pool is None:
                    answers = solver.answers(workload.W, m.y)
                else:
                    d.pool.set_y(d.planned, m.y)
                    answers = d.pool.answers(workload.W)
                answers, comment = _post_process(d, chosen, workload.W, m.y, answers,
                                                 nonnegative, integer)
                parts = [(out, answers, expl.stderr, halfwidth) for out in workload.outputs]
                record = reuse_mod.record_of(m.release_id, workload, chosen.A, m.y,
                                             new.mechanism, new.sigma)
                results = self._write(con, m.release_id, m.result_tables, policy, parts,
                                      replace, comment, record=record, private=m.private)
                done.append(Release(m.release_id, policy.table, list(m.result_tables),
                                    float(eps), float(cost.delta), expl.strategy, new.sigma,
                                    expl.rmse, results, m.private, name=name))
        if interrupted:
            raise InterruptedAfterRelease(done[0])
        return done[0]

    def _decide(self, con, policy, workload, eps, dlt, strategy, calibration, objective,
                reuse: bool):
        """How the batch is answered (:func:`dpsql.mechanisms.reuse.decide`; public inputs only)."""
        records = reuse_mod.load(con, policy, self.kernel.private) if reuse else []
        return reuse_mod.decide(con, policy, workload, records, eps, dlt, strategy,
                                calibration, objective[0] if objective else "rmse",
                                objective[1] if objective else None)

    def _answer_free(self, con, policy, workload, d, text, result_names, params, replace,
                     name, nonnegative, integer, done):
        """Every answer comes from past releases: nothing is measured, nothing is spent; the
        release is still recorded (at zero cost) and its tables written like any other."""
        expl = d.expl
        request = ledger.Charge(
            table=policy.table, cost=PrivacyCost(0, 0), mechanism="reuse", strategy="reuse",
            calibration=None, sigma=None, sensitivity=None, rho=0.0,
            n_queries=workload.n_queries, n_cells=workload.n_cells, expected_rmse=expl.rmse,
            sql_text=text, bound_ratio=None, result_tables=result_names,
            private=self.kernel.private, release_name=name, request=params,
            reused_from=_sources(d))
        halfwidth = d.pool.halfwidths(workload.W, expl.stderr ** 2)
        answers = d.pool.answers(workload.W)
        answers, comment = _post_process(d, None, workload.W, None, answers, nonnegative,
                                         integer)
        with _interrupts_deferred() as interrupted:
            release_id, tables = ledger.charge(con, policy, request)
            parts = [(out, answers, expl.stderr, halfwidth) for out in workload.outputs]
            results = self._write(con, release_id, tables, policy, parts, replace, comment)
            done.append(Release(release_id, policy.table, list(tables), 0.0, 0.0, "reuse",
                                math.nan, expl.rmse, results, self.kernel.private, name=name))
        if interrupted:
            raise InterruptedAfterRelease(done[0])
        return done[0]

    def budget(self, table: str | None = None) -> dict:
        """Spent and remaining (ε, δ) per protected table (exact fractions and floats)."""
        with self.db.connect() as con:
            policies = ledger.load_policies(con)
            if table is not None:
                if table.lower() not in policies:
                    raise UnknownTableError(f"table {table!r} is not protected; `dpsql "
                                            "budget DB` lists the protected tables")
                policies = {table.lower(): policies[table.lower()]}
            out = {}
            for name, p in policies.items():
                reading = ledger.total(con, p)
                used = reading.reported(p.budget)
                left = ledger.remaining(p, reading)
                out[name] = {
                    "accounting": reading.method,
                    "epsilon_limit": p.epsilon, "delta_limit": p.delta,
                    "epsilon_spent": used.epsilon, "delta_spent": used.delta,
                    "epsilon_remaining": left.epsilon, "delta_remaining": left.delta,
                    # the two routes of the filter (docs/accounting.md)
                    "zcdp_delta": p.zcdp_delta,
                    "basic_epsilon": reading.basic.epsilon, "basic_delta": reading.basic.delta,
                    "basic_delta_limit": p.budget.basic_delta,
                    "rho_spent": reading.rho, "zcdp_epsilon": reading.zcdp_epsilon,
                }
                if p.metric is not None:
                    used_metric = ledger.spent_metric(con, name)
                    out[name].update({
                        "metric_epsilon_limit": p.metric.epsilon_per_unit,
                        "metric_epsilon_spent": used_metric,
                        "metric_epsilon_remaining": p.metric.epsilon_per_unit - used_metric})
        return out[table.lower()] if table is not None else out

    def ledger(self, table: str | None = None) -> list[dict]:
        with self.db.connect() as con:
            return ledger.entries(con, table.lower() if table else None)

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ internals
    @staticmethod
    def _recorded(con, entry: dict, text: str, eps, dlt, strategy: str,
                  calibration: str, model: str = "dp", extra: dict | None = None) -> Release:
        """A named release asked again: its recorded answers, or a refusal. Never new noise.

        "The same request" is the same SQL and the same parameters as asked (ε, δ, strategy,
        calibration, model), recorded with the charge."""
        name = entry["release_name"]
        same = request_matches(entry, text, eps, dlt, strategy, calibration, model, extra)
        if not same:
            raise DpsqlError(
                f"release name {name!r} is already used (release {entry['release_id']}) for a "
                "different batch or different parameters; choose another name")
        if entry["status"] != "released":
            raise DpsqlError(
                f"release {name!r} was charged but its results were never written (it was "
                "interrupted); its budget stays spent and it cannot be re-noised for free; "
                "choose another name to release again")
        results = []
        for table in entry["result_tables"]:
            owner = ledger.table_owner(con, table)
            if not engine.table_exists(con, table) or owner != entry["release_id"]:
                later = (f" (release {owner} has replaced it)" if owner is not None
                         and owner != entry["release_id"] else "")
                raise DpsqlError(
                    f"release {name!r} is recorded, but its result table {table!r} no longer "
                    f"holds its answers{later}; they cannot be returned again without a new "
                    "charge")
            with engine.engine_errors(f"reading result table {table!r}"):
                cur = con.execute(f"SELECT * FROM main.{engine.quote_ident(table)}")
                cols = tuple(d[0] for d in cur.description)
                results.append(ResultTable(table, cols, cur.fetchall()))
        return Release(entry["release_id"], entry["table_name"], list(entry["result_tables"]),
                       entry["epsilon"], entry["delta"], entry["strategy"], entry["sigma"],
                       entry["expected_rmse"], results, entry["private"], name=name,
                       reused=True)

    def _recorded_target(self, con, entry: dict, text: str, dlt, strategy: str,
                         calibration: str, model: str, flags: dict, objective) -> Release:
        """A named accuracy-first release asked again: the same request at the ε recorded
        then (the ε a target needs changes once past releases can be combined), returned
        only if the recorded answers meet the target. Never new noise."""
        request = json.loads(entry.get("request") or "{}")
        eps = (fraction_from_text(request["epsilon"]) if "epsilon" in request
               else Fraction(repr(entry["epsilon"])))
        release = self._recorded(con, entry, text, eps, dlt, strategy, calibration, model,
                                 flags)
        if objective[0] == "rmse":
            achieved = release.expected_rmse
        else:
            achieved = max((float(row[list(t.columns).index("stderr")]) for t in
                            release.results for row in t.rows
                            if "stderr" in t.columns), default=math.nan)
        if not achieved <= objective[1] * (1 + 1e-9):
            raise DpsqlError(
                f"release name {entry['release_name']!r} is recorded with an expected "
                f"{objective[0].replace('_', ' ')} of {achieved:g}, which does not meet "
                f"{objective[1]:g}; choose another name to release again")
        return release

    @staticmethod
    def _parse(sql, policies) -> tuple[TablePolicy, list]:
        def resolve(name, node):
            if name not in policies:
                from dpsql.sql.parse import _position
                line, col = _position(node)
                known = ", ".join(sorted(policies)) or "none yet; see protect()"
                raise UnknownTableError(
                    f"table {name!r} is not a protected table (protected: {known})", line, col)
            return policies[name]

        from dpsql.sql import memo     # parsed batches are remembered (public inputs only)

        queries = memo.parsed(memo.batch_key(sql, policies), lambda: parse_batch(sql, resolve))
        check_result_names(queries, policies)     # planning: before any charge, explain too
        return policies[queries[0].table], queries

    @classmethod
    def _compile(cls, sql, policies) -> tuple[TablePolicy, list, Workload]:
        from dpsql.sql import memo     # compiled batches are remembered (immutable workloads)

        policy, queries = cls._parse(sql, policies)
        return policy, queries, memo.compiled(memo.batch_key(sql, policies), queries, policy)

    @staticmethod
    def _check_targets(con, queries, policies, replace: bool) -> set:
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

    @staticmethod
    def _result_names(con, queries, names_given):
        """Names of the result tables, as a function of the new release id."""
        def result_names(release_id: int) -> list[str]:
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
        return result_names

    def _write(self, con, release_id, names, policy, parts, replace,
               comment: str | None = None, record=None, private: bool = False) -> list:
        """Write each statement's result table and mark the release done, in one transaction.

        ``parts``: per statement in order, ``(output, answers, stderr, halfwidth)`` with the
        arrays indexed like the output's rows of ``W``."""
        results = []
        with engine.engine_errors("writing results"):
            con.execute("BEGIN TRANSACTION")
        try:
            recorded = []
            for name, (out, answers, stderr, halfwidth) in zip(names, parts):
                cols = build_columns(out, policy, answers, stderr, halfwidth)
                engine.write_table(con, name, cols, replace=replace or out.query.replace
                                   or out.query.target is None, comment=comment)
                rows = list(zip(*[v for _, _, v in cols])) if cols else []
                results.append(ResultTable(name, tuple(c for c, _, _ in cols), rows))
                recorded.append((out.query.index, name, out.query.sql, len(rows)))
            ledger.mark_released(con, release_id, recorded)
            if record is not None:     # kept for later batches to reuse (public: released)
                reuse_mod.store(con, policy, record, private)
            with engine.engine_errors("writing results"):
                con.execute("COMMIT")
        except BaseException:
            try:
                con.execute("ROLLBACK")
            except Exception:
                pass
            raise
        return results


def _sources(d) -> str | None:
    """The past releases a decision combines, as recorded in the ledger."""
    return ",".join(str(r) for r in d.pool.release_ids) if d.pool is not None else None


def _post_process(d, plan, W, y, answers, nonnegative: bool, integer: bool):
    """Consistency post-processing (:func:`dpsql.inference.least_squares.consistent`): over the plan's
    measurements, or over every combined measurement when past releases are reused."""
    if not (nonnegative or integer):
        return answers, None
    if d.pool is not None:
        A, ys, Wr = d.pool.stacked(W)
        return consistent(_Stacked(A), Wr, ys, answers, nonnegative, integer)
    return consistent(plan, W, y, answers, nonnegative, integer)


class _Stacked:
    """The weighted stack of every combined measurement, seen as one plan."""

    def __init__(self, A):
        self.A = A


def _rho(expl: Explanation, eps, plan) -> float:
    """zCDP cost recorded with the charge: Δ²/2σ² (Gaussian, Bun & Steinke 2016 Prop. 1.6,
    grid slack included) or ε²/2 (pure ε-DP implies ε²/2-zCDP, ibid. Prop. 1.4)."""
    if expl.mechanism == "laplace":
        return float(eps) ** 2 / 2.0
    return zcdp_rho(expl.sigma, plan.sensitivity + rounding_slack(expl.sigma,
                                                                  plan.n_measurements))


def connect(path: str = ":memory:", **kwargs) -> Session:
    """Open a dpsql session on a DuckDB database file (created if missing)."""
    return Session(path, **kwargs)
