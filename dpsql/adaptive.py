"""Requests for the mechanisms beyond the matrix mechanism: MWEM and d_X Laplace.

Public inputs only (the session charges and the kernel runs the algorithm). A request names
``mwem`` or ``mwem(option=value, ...)``; options (Hardt, Ligett & McSherry's practical
variants, see :mod:`dpsql.mwem`):

``rounds`` (integer ≥ 1 or ``auto``), ``iterate`` (``last`` or ``average``), ``replay``
(integer), ``init_share`` (share of ε for a noisy initial histogram), ``cuboids``
(``true``: select and measure whole GROUP BY groups), ``total_share`` (share of ε for the row
count when the policy does not declare ``rows`` public).

MWEM's error depends on the data, so explain gives no expected RMSE: it states the paper's
worst-case bound (Theorem 2.3) instead.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from .errors import PolicyError, StrategyError
from .mwem import Block, MWEMOptions, mwem_error_bound
from .results import Candidate, Explanation
from .sql.compile import compile_blocks
from .strategies.spec import parse

#: option -> (kind, help)
OPTIONS = {
    "rounds": "integer >= 1 or auto",
    "iterate": "last|average",
    "replay": "integer 0..1000",
    "init_share": "number in [0, 1)",
    "cuboids": "true|false",
    "total_share": "number in (0, 1)",
}


def is_mwem(strategy) -> bool:
    return isinstance(strategy, str) and parse(strategy)[0] == "mwem"


def mwem_options(spec: str, policy) -> MWEMOptions:
    """Validated options of an ``mwem(...)`` spec; the policy's public ``rows`` is N."""
    _, items = parse(spec)
    values: dict = {}
    for key, kind, text in items:
        if key not in OPTIONS:
            raise StrategyError(
                f"mwem has no option {key!r}; allowed: "
                + ", ".join(f"{k} ({v})" for k, v in OPTIONS.items()))
        if key in values:
            raise StrategyError(f"mwem option {key!r} is given twice")
        values[key] = _value(key, kind, text)
    if policy.rows is not None:
        if "total_share" in values:
            raise StrategyError(
                f"table {policy.table!r} declares its row count public (rows = "
                f"{policy.rows}); mwem needs no total_share")
        values["total"] = policy.rows
    return MWEMOptions(**values)


def _value(key: str, kind: str, text: str):
    lower = text.lower()
    if key == "rounds" and lower == "auto":
        return "auto"
    if key in ("rounds", "replay"):
        if kind != "number" or not text.isdigit():
            raise StrategyError(f"mwem option {key!r} needs an integer, got {text!r}")
        return int(text)
    if key == "iterate":
        return lower
    if key == "cuboids":
        if lower not in ("true", "false"):
            raise StrategyError(f"mwem option 'cuboids' needs true or false, got {text!r}")
        return lower == "true"
    if kind != "number":
        raise StrategyError(f"mwem option {key!r} needs a number, got {text!r}")
    return Fraction(text)


def blocks_for(queries, policy):
    """``[(workload, statement indices)]`` per block and the matching :class:`mwem.Block`."""
    compiled = compile_blocks(queries, policy)
    blocks = []
    for workload, _ in compiled:
        groups = []
        for out in workload.outputs:
            if out.grouping_ids is None:
                groups.append((out.start, out.stop))
                continue
            start = out.start          # one candidate group per grouping set (cuboid)
            for k in range(1, out.stop - out.start + 1):
                end = k == out.stop - out.start
                if end or out.grouping_ids[k] != out.grouping_ids[k - 1]:
                    groups.append((start, out.start + k))
                    start = out.start + k
        blocks.append(Block(workload.W, groups, workload.n_cells))
    return compiled, blocks


def explain_mwem(policy, compiled, eps, options: MWEMOptions, strategy: str) -> Explanation:
    """MWEM's explanation: no expected RMSE (data-dependent), Theorem 2.3's bound instead."""
    n_queries = sum(w.n_queries for w, _ in compiled)
    sizes = [w.n_cells for w, _ in compiled]
    rounds = options.rounds if isinstance(options.rounds, int) else 10
    share = 1 - options.init_share - (options.total_share or 0)
    eps_rounds = Fraction(eps) * share
    total = policy.rows
    per_record = mwem_error_bound(1, sizes, max(1, n_queries), rounds, eps_rounds) \
        - mwem_error_bound(0, sizes, max(1, n_queries), rounds, eps_rounds)
    constant = mwem_error_bound(0, sizes, max(1, n_queries), rounds, eps_rounds)
    if total is not None:
        bound = f"{per_record * total + constant:.4g}"
    else:
        bound = f"{per_record:.3g}·N + {constant:.4g} (N = the table's row count)"
    t_text = (f"T = {rounds}" if isinstance(options.rounds, int)
              else "T = 10 shown; rounds=auto picks T by doubling")
    note = (f"data-dependent error: no expected RMSE. Paper bound (Hardt, Ligett & McSherry, "
            f"Thm 2.3; plain algorithm, {t_text}): max error <= {bound} with probability "
            f">= 95%")
    cand = Candidate(strategy, math.nan, 1.0, math.nan, np.zeros(0), note=note,
                     mechanism="mwem")
    stderr = np.full(n_queries, math.nan)
    statements = []
    for workload, indices in compiled:
        for out in workload.outputs:
            statements.append((out.query.index, out.start, out.stop))
    return Explanation(policy.table, float(eps), 0.0, strategy, math.nan, math.nan, stderr,
                       n_queries, int(np.prod(sizes, dtype=float)), (cand,),
                       tuple(sorted(statements)), mechanism="mwem")


def explain_dx(policy, workload, eps) -> tuple[Explanation, object]:
    """The d_X Laplace plan of a batch and its explanation (Kamalaruban et al.).

    Public only: the cell metric comes from the policy's declared model, the scales from the
    convex program of :func:`dpsql.dx.dx_laplace_scales`. The comparison row is standard
    Laplace at ε·d_min (the closest pair of cells), the vanilla baseline. Queries constant on
    every cell (a total count) would get no noise under d_X; they are allowed only when the
    table declares its row count public (``rows``), else refused.
    """
    from .dx import dx_laplace_scales
    from .metric import cell_distance_graph

    if policy.metric is None:
        raise PolicyError(f"table {policy.table!r} declares no metric model; add a "
                          f"[tables.{policy.table}.metric] section to its policy for metric "
                          "(d_X) releases")
    graph = cell_distance_graph(policy.metric, workload.partitions, policy)
    plan = dx_laplace_scales(workload.W, graph, float(eps), allow_exact=True)
    if policy.rows is None and plan.exact.any():
        rows = np.flatnonzero(plan.exact)
        where = sorted({o.query.index + 1 for o in workload.outputs
                        for r in rows if o.start <= r < o.stop})
        raise StrategyError(
            f"statement(s) {where} count the same on every cell (e.g. the total row count): "
            "under metric (d_X) privacy that is released exactly, since only changes of a "
            f"record's value are protected; declare the row count public (rows = ... in "
            f"table {policy.table!r}'s policy) or leave such counts out of metric batches")
    stderr = math.sqrt(2.0) * plan.scales
    dx = Candidate("dx_laplace", math.nan, math.nan, plan.expected_rmse, stderr,
                   seconds=plan.solve_seconds, mechanism="dx_laplace",
                   note=f"{plan.method} program, {plan.n_constraints} constraints")
    base = Candidate("laplace at ε·d_min", plan.baseline_scale, math.nan, plan.baseline_rmse,
                     np.zeros(0), mechanism="laplace",
                     note=f"baseline only: standard Laplace at ε·d_min = "
                          f"{float(eps) * plan.d_min:.4g}")
    expl = Explanation(policy.table, float(eps), 0.0, "dx_laplace", math.nan,
                       plan.expected_rmse, stderr, workload.n_queries, workload.n_cells,
                       (dx, base),
                       tuple((o.query.index, o.start, o.stop) for o in workload.outputs),
                       mechanism="dx_laplace")
    return expl, plan
