"""The mechanisms beyond the matrix mechanism, as release-path mechanisms: MWEM
(data-dependent, pure ε-DP) and the metric (d_X) mechanisms: d_X Laplace, d_X MWEM, d_X
SmallDB. Each ``plan_*(ask, public)`` is public only (:mod:`dpsql.mechanisms.catalog`);
its plan measures through the kernel handle (the data-dependent ones get the kernel's
measure callback, never the counts) and infers the answers to write."""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from dpsql.errors import PrivacyParameterError, StrategyError, UnsupportedQueryError
from dpsql.mechanisms import catalog
from dpsql.mechanisms.mwem.core import run_mwem
from dpsql.mechanisms.mwem.options import check_run
from dpsql.noise.accounting import PrivacyCost
from dpsql.release.mechanism import Answers, Ask, Cost, Plan, Public, Shown
from dpsql.release.support import _request_params
from dpsql.sql.expand import needs_assembly


@dataclass
class SyntheticPlan(Plan):
    """A data-dependent release (MWEM, d_X MWEM, d_X SmallDB): the kernel charges the full
    ε, then runs ``algorithm(oracle)`` against its measure callback; the answers have no
    standard errors (their error depends on the data)."""

    workloads: list = None
    algorithm: object = None         # oracle -> the answers of each block
    graphs: list | None = None       # d_X: each block's public cell metric

    def measure(self, handle):
        if self.graphs is None:
            return handle.release_adaptive(self.workloads, Fraction(self.cost.cost.epsilon),
                                           self.algorithm)
        return handle.release_adaptive_metric(self.workloads, self.graphs,
                                              self.cost.metric_epsilon, self.algorithm)

    def infer(self, answers) -> Answers:
        return Answers(_synthetic_parts(self.workloads, answers))


def counts_per_row(policy, queries, what: str) -> None:
    """Refuse, before any charge, what these mechanisms do not answer: quantiles and GROUP BY
    on a public table's column, SUM/AVG (the matrix mechanism answers them) and a table with
    a privacy unit (their
    sensitivities and metrics are for one row; the kernel refuses too)."""
    from dpsql.sql.vectors import has_values

    for q in queries:           # answered from other rows' released answers (sql/expand.py)
        if needs_assembly(q):
            shown = ("a quantile" if q.quantile is not None
                     else "GROUP BY on a public table's column")
            raise UnsupportedQueryError(
                f"statement {q.index + 1}: {shown} is answered by the matrix mechanism "
                f"(strategy auto or a named strategy, model dp), not by {what}; submit it in "
                "a batch of its own")
    if has_values(queries):
        raise StrategyError(f"{what} answers COUNT batches only; SUM and AVG are answered by "
                            "the matrix mechanism: use strategy 'auto' (model 'dp')")
    if policy.privacy_unit is not None:
        raise StrategyError(
            f"table {policy.table!r} declares privacy unit {policy.privacy_unit!r} (user-level "
            f"privacy); {what} bounds one row's effect only: use strategy 'auto' (model 'dp')")


def plan_mwem(ask: Ask, public: Public) -> SyntheticPlan:
    """MWEM (Hardt, Ligett & McSherry): pure ε-DP, the full ε charged up front. A batch
    whose connected column groups are too wide for the factored form runs over a graphical
    model instead (:mod:`dpsql.release.mwem_graphical`)."""
    eps, dlt, strategy = ask.epsilon, ask.delta, ask.strategy
    policy, queries = public.parse(ask.sql)
    counts_per_row(policy, queries, "mwem")
    if dlt != 0:
        raise PrivacyParameterError(
            "mwem is a pure epsilon-DP mechanism: ask for it with delta = 0")
    options = catalog.mwem_options(strategy, policy)
    try:
        compiled, blocks = catalog.blocks_for(queries, policy)
    except UnsupportedQueryError:       # a connected group over the dense cell limit
        from dpsql.release import mwem_graphical

        workload = mwem_graphical.implicit_workload(ask, public, policy, queries)
        if workload is None:
            raise
        return mwem_graphical.plan(ask, public, policy, queries, workload, options)
    check_run(blocks, eps, options, strategy)   # spends' ε and run time: before any charge
    expl = catalog.explain_mwem(policy, compiled, eps, options, strategy)
    eps_exact = Fraction(eps)

    def algorithm(oracle):
        return run_mwem(blocks, eps_exact, oracle, options).answers

    workloads = [w for w, _ in compiled]
    cost = Cost(cost=PrivacyCost(eps, dlt), mechanism="mwem", strategy=strategy,
                n_queries=expl.n_queries, n_cells=sum(w.n_cells for w in workloads),
                params=_request_params(eps, dlt, strategy, "analytic", "dp"),
                sensitivity=1.0, rho=float(eps) ** 2 / 2.0)
    return SyntheticPlan(policy, queries, expl, cost, Shown(float(eps), 0.0, strategy),
                         workloads=workloads, algorithm=algorithm)


def _metric_cost(ask: Ask, mechanism: str, strategy: str, n_queries: int, n_cells: int,
                 **fields) -> Cost:
    """A metric release's cost: ε per unit distance, charged to the metric budget only."""
    return Cost(cost=PrivacyCost(0, 0), mechanism=mechanism, strategy=strategy,
                n_queries=n_queries, n_cells=n_cells, metric_epsilon=Fraction(ask.epsilon),
                params=_request_params(ask.epsilon, 0, ask.strategy, "analytic", "metric"),
                **fields)


def plan_dx_mwem(ask: Ask, public: Public) -> SyntheticPlan:
    """d_X MWEM (Kamalaruban et al., Algorithm 2) against the kernel's metric oracle."""
    policy, queries = public.parse(ask.sql)
    counts_per_row(policy, queries, "a d_X (metric) release")
    expl, options, compiled, blocks, graphs = catalog.dx_mwem_plan(policy, queries,
                                                                   ask.epsilon, ask.strategy)
    workloads = [w for w, _ in compiled]
    eps = Fraction(ask.epsilon)

    def algorithm(oracle):
        return run_mwem(blocks, eps, oracle, options).answers

    cost = _metric_cost(ask, "dx_mwem", ask.strategy, expl.n_queries,
                        sum(w.n_cells for w in workloads),
                        sensitivity=expl.candidates[0].sensitivity)
    return SyntheticPlan(policy, queries, expl, cost,
                         Shown(float(ask.epsilon), 0.0, ask.strategy),
                         workloads=workloads, algorithm=algorithm, graphs=graphs)


def plan_dx_smalldb(ask: Ask, public: Public) -> SyntheticPlan:
    """d_X SmallDB (Kamalaruban et al. §3.2): one candidate histogram, selected by the d_X
    exponential mechanism in the kernel's metric oracle."""
    counts_per_row(*public.parse(ask.sql), "a d_X (metric) release")
    policy, queries, workload = public.compile(ask.sql)
    expl, size, graph = catalog.dx_smalldb_plan(policy, workload, ask.epsilon, ask.strategy)
    eps = Fraction(ask.epsilon)

    def algorithm(oracle):
        from dpsql.mechanisms.dx.mechanisms import smalldb_candidates

        Y = smalldb_candidates(workload.n_cells, size)
        k = oracle.select_synthetic(0, workload.W, Y, size, policy.rows, eps)
        synthetic = np.asarray(Y[k].todense(), dtype=float).reshape(-1)
        return [np.asarray(workload.W @ synthetic).reshape(-1) * policy.rows / size]

    cost = _metric_cost(ask, "dx_smalldb", ask.strategy, expl.n_queries, workload.n_cells,
                        sensitivity=expl.candidates[0].sensitivity)
    return SyntheticPlan(policy, queries, expl, cost,
                         Shown(float(ask.epsilon), 0.0, ask.strategy),
                         workloads=[workload], algorithm=algorithm, graphs=[graph])


@dataclass
class DxLaplacePlan(Plan):
    """d_X Laplace: per-query Laplace scales from the public convex program, answers with
    exact standard errors."""

    workload: object = None
    scales: object = None

    def measure(self, handle):
        return handle.release_per_query(self.workload, self.scales)

    def infer(self, m) -> Answers:
        halfwidth = self.scales * math.log(20.0)   # P(|Lap(b)| > b ln 20) = 5%
        stderr = self.explanation.stderr
        return Answers([(out, m.y, stderr, halfwidth) for out in self.workload.outputs])


def plan_dx_laplace(ask: Ask, public: Public) -> DxLaplacePlan:
    counts_per_row(*public.parse(ask.sql), "a d_X (metric) release")
    policy, queries, workload = public.compile(ask.sql)
    expl, scales = catalog.explain_dx(policy, workload, ask.epsilon)
    cost = _metric_cost(ask, "dx_laplace", "dx_laplace", workload.n_queries, workload.n_cells,
                        expected_rmse=scales.expected_rmse)
    return DxLaplacePlan(policy, queries, expl, cost,
                         Shown(float(ask.epsilon), 0.0, "dx_laplace", math.nan,
                               scales.expected_rmse),
                         workload=workload, scales=scales.scales)


def _dense_only(kind: str, planner):
    """The d_X planner, refusing up front and saying why a batch whose cell product is over
    the dense limit: d_X privacy is defined by the metric between cells (the kernel checks
    every edge of the cell graph), which Kronecker blocks do not carry."""
    def plan(ask: Ask, public: Public):
        try:
            return planner(ask, public)
        except UnsupportedQueryError:
            from dpsql.sql.compile import MAX_CELLS, compile_parts

            policy, queries = public.parse(ask.sql)
            counts_per_row(policy, queries, kind)   # the refusal, if it was this one
            parts = compile_parts(queries, policy)
            if parts.n_cells <= MAX_CELLS:
                raise
            raise UnsupportedQueryError(
                f"{kind} (metric privacy, d_X) needs the batch's full cell product, whose "
                f"metric the kernel checks edge by edge; this batch's has {parts.n_cells:,} "
                f"cells (limit {MAX_CELLS:,}; parts per column: "
                + ", ".join(f"{p.column}={p.n_parts}" for p in parts.partitions)
                + "), and d_X is not supported over Kronecker blocks; nothing was charged; "
                "ask it over fewer columns per request, or use standard DP (model 'dp'), "
                "which answers such batches through marginals") from None
    return plan


#: metric strategy name -> its mechanism
DX = {name: _dense_only(name, planner) for name, planner in
      (("dx_laplace", plan_dx_laplace), ("dx_mwem", plan_dx_mwem),
       ("dx_smalldb", plan_dx_smalldb))}


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
