"""Orchestration: parse -> compile -> select -> (kernel) -> infer -> release.

``explain`` runs the public half of the pipeline only: it never reads data nor touches the
budget. ``answer`` validates everything (SQL, policy, privacy parameters, result names,
strategy, budget fit) before the kernel reads a single row, so a bad request charges nothing.
"""

from __future__ import annotations

import contextlib
import math
import signal
import threading
import time
from fractions import Fraction
from typing import Sequence

import numpy as np

from . import engine, ledger, strategy_cache
from .accounting import PrivacyCost, check_budget, validate_delta, validate_epsilon
from .errors import (DpsqlError, PolicyError, PrivacyParameterError, StrategyError,
                     UnsupportedQueryError)
from .inference import LeastSquares
from .kernel import Kernel
from .noise import calibrate_with_rounding, rounding_slack, zcdp_rho
from .policy import TablePolicy, load_policy
from .results import Candidate, Explanation, Release, ResultTable, build_columns
from .sql.compile import Workload, compile_workload
from .sql.parse import parse_batch
from .strategies import AUTO_CANDIDATES, REGISTRY, WorkloadInfo, bounds

CALIBRATIONS = ("analytic", "classic")


class Session:
    """A dpsql connection to one DuckDB database. Create it with :func:`dpsql.connect`."""

    def __init__(self, path: str = ":memory:", *, lock_timeout: float = 30.0, sampler=None):
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
                raise PolicyError(f"there is no table {tp.table!r} in the database to protect")
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

    def explain(self, sql: str | Sequence[str], *, epsilon, delta, strategy: str = "auto",
                calibration: str = "analytic") -> Explanation:
        """Expected accuracy of a request: reads no data, spends nothing."""
        eps, dlt = self._privacy(epsilon, delta, calibration)
        with self.db.connect() as con:
            policies = ledger.load_policies(con)
            policy, queries, workload = self._compile(sql, policies)
            return self._select(policy, workload, eps, dlt, strategy, calibration, con)

    def answer(self, sql: str | Sequence[str], *, epsilon, delta, strategy: str = "auto",
               calibration: str = "analytic", replace: bool = False,
               name: str | None = None) -> Release:
        """Release noisy answers to a batch, charging (epsilon, delta) to the table's budget.

        ``name`` makes the release idempotent: asking again under the same name with the same
        SQL and parameters returns the recorded answers (no charge, no fresh noise); anything
        else under a used name is refused.
        """
        eps, dlt = self._privacy(epsilon, delta, calibration)
        text = sql if isinstance(sql, str) else ";\n".join(sql)
        if name is not None and (not isinstance(name, str) or not name.strip()):
            raise DpsqlError("a release name must be a non-empty string")
        with self.db.connect() as con:
            if name is not None:
                recorded = ledger.find_named(con, name)
                if recorded is not None:
                    return self._recorded(con, recorded, text, eps, dlt, strategy,
                                          calibration)
            policies = ledger.load_policies(con)
            policy, queries, workload = self._compile(sql, policies)
            names_given = self._check_targets(con, queries, policies, replace)
            expl = self._select(policy, workload, eps, dlt, strategy, calibration, con)
            best = next(c for c in expl.candidates if c.strategy == expl.strategy)
            chosen = best.plan
            solver = LeastSquares(chosen)
            cost = PrivacyCost(eps, dlt)
            check_budget(policy.table, ledger.spent(con, policy.table), cost,
                         PrivacyCost(policy.epsilon, policy.delta))

            def result_names(release_id: int) -> list[str]:
                out = []
                for q in queries:
                    if q.target is not None:
                        out.append(q.target)
                        continue
                    name, k = f"dp_r{release_id}_q{q.index + 1}", 1
                    while engine.table_exists(con, name) or name in names_given:
                        k += 1
                        name = f"dp_r{release_id}_q{q.index + 1}_{k}"
                    out.append(name)
                return out

            request = ledger.Charge(
                table=policy.table, cost=cost, mechanism="gaussian", strategy=expl.strategy,
                calibration=calibration, sigma=expl.sigma, sensitivity=chosen.sensitivity,
                rho=zcdp_rho(expl.sigma, chosen.sensitivity
                             + rounding_slack(expl.sigma, chosen.n_measurements)),
                n_queries=workload.n_queries,
                n_cells=workload.n_cells, expected_rmse=expl.rmse, sql_text=text,
                bound_ratio=expl.bound_ratio,
                result_tables=result_names, private=self.kernel.private, release_name=name)
            with _interrupts_deferred() as interrupted:
                # from the charge to the committed result tables, Ctrl-C waits: a charged
                # release is always completed, never left half-written
                m = self.kernel.release(con, policy, workload, chosen, expl.sigma, request)
                answers = solver.answers(workload.W, m.y)
                stderr = expl.stderr
                results = self._write(con, m, policy, queries, workload, answers, stderr,
                                      replace)
        release = Release(m.release_id, policy.table, list(m.result_tables), float(eps),
                          float(dlt), expl.strategy, expl.sigma, expl.rmse, results, m.private,
                          name=name)
        if interrupted:
            raise InterruptedAfterRelease(release)
        return release

    def budget(self, table: str | None = None) -> dict:
        """Spent and remaining (ε, δ) per protected table (exact fractions and floats)."""
        with self.db.connect() as con:
            policies = ledger.load_policies(con)
            if table is not None:
                if table.lower() not in policies:
                    raise PolicyError(f"table {table!r} is not protected")
                policies = {table.lower(): policies[table.lower()]}
            out = {}
            for name, p in policies.items():
                used = ledger.spent(con, name)
                left = ledger.remaining(p, used)
                out[name] = {
                    "epsilon_limit": p.epsilon, "delta_limit": p.delta,
                    "epsilon_spent": used.epsilon, "delta_spent": used.delta,
                    "epsilon_remaining": left.epsilon, "delta_remaining": left.delta,
                }
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
                  calibration: str) -> Release:
        """A named release asked again: its recorded answers, or a refusal. Never new noise."""
        name = entry["release_name"]
        same = (entry["sql_text"] == text and Fraction(entry["epsilon"]) == Fraction(float(eps))
                and Fraction(entry["delta"]) == Fraction(float(dlt))
                and strategy in ("auto", entry["strategy"])
                and calibration == entry["calibration"])
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

    @staticmethod
    def _privacy(epsilon, delta, calibration):
        eps = validate_epsilon(epsilon)
        dlt = validate_delta(delta)
        if calibration not in CALIBRATIONS:
            raise PrivacyParameterError(
                f"calibration must be one of {CALIBRATIONS}, got {calibration!r}")
        if dlt == 0:
            raise PrivacyParameterError(
                "delta = 0 asks for pure epsilon-DP, which the Gaussian mechanism cannot give; "
                "use delta > 0 (e.g. 1e-6)")
        if calibration == "classic" and eps >= 1:
            raise PrivacyParameterError(
                "the classic Gaussian calibration is only valid for epsilon < 1; "
                "use calibration='analytic'")
        return eps, dlt

    @staticmethod
    def _compile(sql, policies) -> tuple[TablePolicy, list, Workload]:
        def resolve(name, node):
            if name not in policies:
                from .sql.parse import _position
                line, col = _position(node)
                known = ", ".join(sorted(policies)) or "none yet; see protect()"
                raise UnsupportedQueryError(
                    f"table {name!r} is not a protected table (protected: {known})", line, col)
            return policies[name]

        queries = parse_batch(sql, resolve)
        policy = policies[queries[0].table]
        return policy, queries, compile_workload(queries, policy)

    @staticmethod
    def _check_targets(con, queries, policies, replace: bool) -> set:
        names = set()
        for q in queries:
            if q.target is None:
                continue
            t = q.target.lower()
            if t in names:
                raise UnsupportedQueryError(f"result table {q.target!r} is named twice in the batch")
            if t in policies or t.startswith("dpsql"):
                raise UnsupportedQueryError(
                    f"result table name {q.target!r} is reserved (a protected table or dpsql's)")
            if engine.table_exists(con, q.target):
                if not (replace or q.replace):
                    raise UnsupportedQueryError(
                        f"table {q.target!r} already exists; use CREATE OR REPLACE TABLE or "
                        "replace=True to overwrite it")
                if not ledger.is_result_table(con, q.target):
                    raise UnsupportedQueryError(
                        f"table {q.target!r} exists and was not created by dpsql; dpsql only "
                        "replaces its own result tables")
            names.add(t)
        return names

    def _plan(self, con, name: str, workload: Workload):
        """(plan, seconds, cached): the strategy's plan, from the cache when it is costly."""
        strategy = REGISTRY[name]
        info = _info(workload)
        started = time.perf_counter()
        key = None
        if getattr(strategy, "cacheable", False) and con is not None:
            key = strategy_cache.fingerprint(name, strategy, info)
            plan = strategy_cache.load(con, key)
            if plan is not None:
                return plan, time.perf_counter() - started, True
        plan = strategy.plan(info)
        seconds = time.perf_counter() - started
        if key is not None:
            strategy_cache.store(con, key, plan, seconds)
        return plan, seconds, False

    def _candidate(self, con, name: str, workload: Workload, eps, dlt, calibration,
                   bound_total: float) -> Candidate:
        plan, seconds, cached = self._plan(con, name, workload)
        solver = LeastSquares(plan)
        factors = solver.error_factors(workload.W)
        sigma = calibrate_with_rounding(float(eps), float(dlt), plan.sensitivity,
                                        plan.n_measurements, calibration)
        stderr = sigma * np.sqrt(np.maximum(factors, 0.0))
        rmse = float(np.sqrt(np.mean(stderr ** 2))) if len(stderr) else 0.0
        ratio = rmse / _bound_rmse(eps, dlt, calibration, bound_total, workload)
        return Candidate(name, sigma, plan.sensitivity, rmse, stderr, seconds=seconds,
                         bound_ratio=ratio, cached=cached, plan=plan)

    def _select(self, policy, workload, eps, dlt, strategy, calibration,
                con=None) -> Explanation:
        if not isinstance(strategy, str) or (strategy != "auto" and strategy not in REGISTRY):
            raise StrategyError(
                f"unknown strategy {strategy!r}; choose 'auto' or one of {sorted(REGISTRY)}")
        names = AUTO_CANDIDATES if strategy == "auto" else (strategy,)
        bound_total = svdb(_info(workload))
        candidates = []
        for name in names:
            estimate = getattr(REGISTRY[name], "estimated_seconds", None)
            seconds = estimate(_info(workload)) if estimate is not None else 0.0
            if strategy == "auto" and seconds > AUTO_TIME_LIMIT:
                candidates.append(Candidate(
                    name, math.nan, math.nan, math.nan, np.zeros(0),
                    note=f"skipped by auto: estimated {seconds:.0f} s to select, over the "
                         f"{AUTO_TIME_LIMIT:.0f} s limit (ask for it by name)"))
                continue
            try:
                candidates.append(self._candidate(con, name, workload, eps, dlt, calibration,
                                                  bound_total))
            except StrategyError as exc:
                if strategy != "auto":
                    raise
                candidates.append(Candidate(name, math.nan, math.nan, math.nan,
                                            np.zeros(0), note=str(exc)))
        usable = [c for c in candidates if np.isfinite(c.rmse)]
        if not usable:
            raise StrategyError("no strategy can answer this batch: "
                                + "; ".join(c.note for c in candidates))
        best = min(usable, key=lambda c: c.rmse)
        return Explanation(policy.table, float(eps), float(dlt), best.strategy, best.sigma,
                           best.rmse, best.stderr, workload.n_queries, workload.n_cells,
                           tuple(candidates),
                           tuple((o.query.index, o.start, o.stop) for o in workload.outputs),
                           bound_rmse=_bound_rmse(eps, dlt, calibration, bound_total,
                                                  workload))

    def _write(self, con, m, policy, queries, workload, answers, stderr, replace) -> list:
        results = []
        with engine.engine_errors("writing results"):
            con.execute("BEGIN TRANSACTION")
        try:
            recorded = []
            for name, out in zip(m.result_tables, workload.outputs):
                cols = build_columns(out, policy, answers, stderr)
                engine.write_table(con, name, cols, replace=replace or out.query.replace
                                   or out.query.target is None)
                rows = list(zip(*[v for _, _, v in cols])) if cols else []
                results.append(ResultTable(name, tuple(c for c, _, _ in cols), rows))
                recorded.append((out.query.index, name, out.query.sql, len(rows)))
            ledger.mark_released(con, m.release_id, recorded)
            with engine.engine_errors("writing results"):
                con.execute("COMMIT")
        except BaseException:
            try:
                con.execute("ROLLBACK")
            except Exception:
                pass
            raise
        return results


#: auto skips a strategy whose estimated selection time exceeds this many seconds
AUTO_TIME_LIMIT = 30.0


def svdb(info: WorkloadInfo) -> float:
    """Singular value bound on ``tr(V (AᵀA)⁻¹)·||A||²`` (:func:`strategies.bounds.svdb`).

    With few queries the eigenvalues come from the m x m matrix ``W Wᵀ`` (same non-zero
    spectrum), else from ``V``.
    """
    if info.W is not None and info.W.shape[0] < info.n:
        lam = np.linalg.eigvalsh((info.W @ info.W.T).toarray())
        return bounds.svdb_from_eigenvalues(lam, info.n)
    return bounds.svdb(info.V, info.n)


def _bound_rmse(eps, dlt, calibration, bound_total: float, workload: Workload) -> float:
    """The RMSE no strategy can beat at this calibration (sensitivity-1 noise scale)."""
    sigma_1 = calibrate_with_rounding(float(eps), float(dlt), 1.0, 1, calibration)
    return sigma_1 * math.sqrt(bound_total / max(1, workload.n_queries))


def _info(workload: Workload) -> WorkloadInfo:
    """The public structure strategies see (cached on the compiled workload)."""
    info = getattr(workload, "_strategy_info", None)
    if info is None:
        info = WorkloadInfo.from_matrix(workload.W, workload.shape)
        object.__setattr__(workload, "_strategy_info", info)
    return info


class InterruptedAfterRelease(KeyboardInterrupt):
    """Ctrl-C arrived while a charged release was being completed; it completed first."""

    def __init__(self, release: Release):
        super().__init__(f"interrupted after release {release.release_id} was charged and "
                         f"written (tables: {', '.join(release.tables)})")
        self.release = release


@contextlib.contextmanager
def _interrupts_deferred():
    """Hold SIGINT until the block ends (main thread only); yields a list, non-empty if one
    arrived."""
    got: list = []
    if threading.current_thread() is not threading.main_thread():
        yield got
        return
    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, lambda signum, frame: got.append(signum))
    try:
        yield got
    finally:
        signal.signal(signal.SIGINT, previous)


def connect(path: str = ":memory:", **kwargs) -> Session:
    """Open a dpsql session on a DuckDB database file (created if missing)."""
    return Session(path, **kwargs)
