"""The release paths other than the matrix mechanism: MWEM (data-dependent, pure ε-DP) and
metric (d_X) releases (d_X Laplace, d_X MWEM, d_X SmallDB). Mixed into
:class:`dpsql.session.Session`, whose parsing, target checks and result writing they share."""

from __future__ import annotations

import json
import math
from fractions import Fraction

import numpy as np

from dpsql.mechanisms import catalog as adaptive
from dpsql.store import ledger
from dpsql.noise.accounting import PrivacyCost
from dpsql.errors import PrivacyParameterError
from dpsql.mechanisms.mwem.core import run_mwem
from dpsql.mechanisms.mwem.options import check_run
from dpsql.release.support import InterruptedAfterRelease, _interrupts_deferred, _request_params
from dpsql.store.results import Release


class AdaptivePaths:
    """MWEM and d_X releases (methods of :class:`dpsql.session.Session`)."""

    def _mwem_plan(self, policy, queries, eps, dlt, strategy):
        """(explanation, options, compiled blocks, MWEM blocks) of an MWEM request."""
        if dlt != 0:
            raise PrivacyParameterError(
                "mwem is a pure epsilon-DP mechanism: ask for it with delta = 0")
        options = adaptive.mwem_options(strategy, policy)
        compiled, blocks = adaptive.blocks_for(queries, policy)
        check_run(blocks, eps, options, strategy)   # spends' ε and run time: before any charge
        expl = adaptive.explain_mwem(policy, compiled, eps, options, strategy)
        return expl, options, compiled, blocks

    def _answer_mwem(self, con, policies, sql, text, eps, dlt, strategy, replace, name, done):
        """Release an MWEM batch: charge the full ε, run the algorithm against the kernel's
        measure callback, write the synthetic answers (no standard errors: data-dependent)."""
        policy, queries = self._parse(sql, policies)
        names_given = self._check_targets(con, queries, policies, replace)
        expl, options, compiled, blocks = self._mwem_plan(policy, queries, eps, dlt, strategy)
        cost = PrivacyCost(eps, dlt)
        ledger.check_fits(con, policy, cost, "mwem", float(eps) ** 2 / 2.0)   # as charged
        request = ledger.Charge(
            table=policy.table, cost=cost, mechanism="mwem", strategy=strategy,
            calibration=None, sigma=None, sensitivity=1.0, rho=float(eps) ** 2 / 2.0,
            n_queries=expl.n_queries, n_cells=sum(w.n_cells for w, _ in compiled),
            expected_rmse=None, sql_text=text, bound_ratio=None,
            result_tables=self._result_names(con, queries, names_given),
            private=self.kernel.private, release_name=name,
            request=json.dumps(_request_params(eps, dlt, strategy, "analytic", "dp")))
        eps_exact = Fraction(eps)

        def algorithm(oracle):
            return run_mwem(blocks, eps_exact, oracle, options)

        with _interrupts_deferred() as interrupted:
            release_id, tables, result, private = self.kernel.release_adaptive(
                con, policy, [w for w, _ in compiled], eps_exact, request, algorithm)
            done.append(self._publish(con, policy, [w for w, _ in compiled], result.answers,
                                      release_id, tables, private, eps, strategy, name,
                                      replace))
        if interrupted:
            raise InterruptedAfterRelease(done[0])
        return done[0]

    def _publish(self, con, policy, workloads, answers, release_id, tables, private, eps,
                 strategy, name, replace) -> Release:
        """Write a data-dependent release's answers (no standard errors) as its tables."""
        parts = _synthetic_parts(workloads, answers)
        results = self._write(con, release_id, tables, policy, parts, replace)
        return Release(release_id, policy.table, list(tables), float(eps), 0.0, strategy,
                       math.nan, math.nan, results, private, name=name)

    @staticmethod
    def _model(model, dlt, strategy) -> str:
        if model not in ("dp", "metric"):
            raise PrivacyParameterError(f"model must be 'dp' (differential privacy) or "
                                        f"'metric' (d_X privacy), got {model!r}")
        if model == "metric":
            if dlt != 0:
                raise PrivacyParameterError(
                    "metric (d_X) releases are pure: ask with delta = 0")
            adaptive.check_dx_spec(strategy)     # a d_X strategy with valid options
        return model

    def _explain_metric(self, policies, sql, eps, strategy):
        """The explanation of a metric (d_X) request, for every d_X strategy (public only)."""
        name = adaptive.dx_strategy(strategy)
        if name == "dx_mwem":
            policy, queries = self._parse(sql, policies)
            return adaptive.dx_mwem_plan(policy, queries, eps, strategy)[0]
        policy, queries, workload = self._compile(sql, policies)
        if name == "dx_smalldb":
            return adaptive.dx_smalldb_plan(policy, workload, eps, strategy)[0]
        return adaptive.explain_dx(policy, workload, eps)[0]

    def _answer_dx(self, con, policies, sql, text, eps, replace, name, strategy, done):
        """A metric (d_X) release: per-query Laplace scales from the public program, charged
        to the table's metric budget (ε per unit distance), answers with exact errors.
        ``dx_mwem(...)`` and ``dx_smalldb(...)`` go to :meth:`_answer_dx_synthetic`."""
        if adaptive.dx_strategy(strategy) != "dx_laplace":
            return self._answer_dx_synthetic(con, policies, sql, text, eps, replace, name,
                                             strategy, done)
        policy, queries, workload = self._compile(sql, policies)
        names_given = self._check_targets(con, queries, policies, replace)
        expl, plan = adaptive.explain_dx(policy, workload, eps)
        metric_eps = Fraction(eps)
        ledger.check_metric(con, policy, metric_eps)    # refuse early; charge() re-checks
        request = ledger.Charge(
            table=policy.table, cost=PrivacyCost(0, 0), mechanism="dx_laplace",
            strategy="dx_laplace", calibration=None, sigma=None, sensitivity=None, rho=None,
            n_queries=workload.n_queries, n_cells=workload.n_cells,
            expected_rmse=plan.expected_rmse, sql_text=text, bound_ratio=None,
            result_tables=self._result_names(con, queries, names_given),
            private=self.kernel.private, release_name=name, metric_epsilon=metric_eps,
            request=json.dumps(_request_params(eps, 0, strategy, "analytic", "metric")))
        halfwidth = plan.scales * math.log(20.0)   # P(|Lap(b)| > b ln 20) = 5%
        with _interrupts_deferred() as interrupted:
            m = self.kernel.release_per_query(con, policy, workload, plan.scales, request)
            parts = [(out, m.y, expl.stderr, halfwidth) for out in workload.outputs]
            results = self._write(con, m.release_id, m.result_tables, policy, parts, replace)
            done.append(Release(m.release_id, policy.table, list(m.result_tables), float(eps),
                                0.0, "dx_laplace", math.nan, plan.expected_rmse, results,
                                m.private, name=name))
        if interrupted:
            raise InterruptedAfterRelease(done[0])
        return done[0]

    def _answer_dx_synthetic(self, con, policies, sql, text, eps, replace, name, strategy,
                             done):
        """d_X MWEM or d_X SmallDB: plan (public), charge the full ε per unit distance to the
        metric budget, run against the kernel's metric oracle, write the synthetic answers
        (no standard errors: data-dependent)."""
        kind = adaptive.dx_strategy(strategy)
        if kind == "dx_mwem":
            policy, queries = self._parse(sql, policies)
            expl, options, compiled, blocks, graphs = adaptive.dx_mwem_plan(
                policy, queries, eps, strategy)
            workloads = [w for w, _ in compiled]

            def algorithm(oracle):
                return run_mwem(blocks, Fraction(eps), oracle, options).answers
        else:
            policy, queries, workload = self._compile(sql, policies)
            expl, size, graph = adaptive.dx_smalldb_plan(policy, workload, eps, strategy)
            workloads, graphs = [workload], [graph]

            def algorithm(oracle):
                from dpsql.mechanisms.dx.mechanisms import smalldb_candidates

                Y = smalldb_candidates(workload.n_cells, size)
                k = oracle.select_synthetic(0, workload.W, Y, size, policy.rows, Fraction(eps))
                synthetic = np.asarray(Y[k].todense(), dtype=float).reshape(-1)
                return [np.asarray(workload.W @ synthetic).reshape(-1) * policy.rows / size]
        names_given = self._check_targets(con, queries, policies, replace)
        metric_eps = Fraction(eps)
        ledger.check_metric(con, policy, metric_eps)    # refuse early; charge() re-checks
        request = ledger.Charge(
            table=policy.table, cost=PrivacyCost(0, 0), mechanism=kind, strategy=strategy,
            calibration=None, sigma=None, sensitivity=expl.candidates[0].sensitivity, rho=None,
            n_queries=expl.n_queries, n_cells=sum(w.n_cells for w in workloads),
            expected_rmse=None, sql_text=text, bound_ratio=None,
            result_tables=self._result_names(con, queries, names_given),
            private=self.kernel.private, release_name=name, metric_epsilon=metric_eps,
            request=json.dumps(_request_params(eps, 0, strategy, "analytic", "metric")))
        with _interrupts_deferred() as interrupted:
            release_id, tables, answers, private = self.kernel.release_adaptive_metric(
                con, policy, workloads, graphs, metric_eps, request, algorithm)
            done.append(self._publish(con, policy, workloads, answers, release_id, tables,
                                      private, eps, strategy, name, replace))
        if interrupted:
            raise InterruptedAfterRelease(done[0])
        return done[0]


def _synthetic_parts(workloads, answers) -> list:
    """Result parts of a data-dependent release (MWEM, d_X MWEM, SmallDB): each block's
    answers, no standard errors or intervals (their error depends on the data), in
    statement order."""
    parts = []
    for workload, block_answers in zip(workloads, answers):
        blank = np.full(len(block_answers), math.nan)
        parts.extend((out, np.asarray(block_answers, dtype=float), blank, blank)
                     for out in workload.outputs)
    parts.sort(key=lambda part: part[0].query.index)
    return parts
