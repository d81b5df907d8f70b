"""Requests for the mechanisms beyond the matrix mechanism: MWEM, and the metric (d_X)
mechanisms: d_X Laplace, d_X MWEM and d_X SmallDB (:mod:`dpsql.mechanisms.dx.mechanisms`).

Public inputs only (the session charges and the kernel runs the algorithm). A request names
``mwem`` or ``mwem(option=value, ...)``; options (Hardt, Ligett & McSherry's practical
variants, see :mod:`dpsql.mechanisms.mwem.core`):

``rounds`` (integer ≥ 1, ``rule`` — the default, :mod:`dpsql.mechanisms.mwem.defaults` — or
``auto``: doubling), ``iterate`` (``last`` or ``average``), ``replay``
(integer), ``init_share`` (share of ε for a noisy initial distribution), ``init``
(``histogram``, or ``marginals``: the product of the noisy one-column marginals), ``cuboids``
(``true``: select and measure whole GROUP BY groups), ``measure`` (``query``, or
``partition``: a selected range or rectangle together with the boxes around it, at the same
cost), ``total_share`` (share of ε for the row count when the policy does not declare
``rows`` public).

MWEM's error depends on the data, so explain gives no expected RMSE: it states the paper's
worst-case bound (Theorem 2.3) instead. The same holds for ``dx_mwem(...)`` (the same options
but ``total_share``: the row count must be declared public) and ``dx_smalldb(size=m)``, whose
explanations give Kamalaruban et al.'s bounds with the score Lipschitz constant of the metric.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from dpsql.noise.accounting import number_from_text
from dpsql.errors import PolicyError, StrategyError
from dpsql.mechanisms.mwem import defaults
from dpsql.mechanisms.mwem.core import Block, MWEMOptions, mwem_error_bound
from dpsql.mechanisms.mwem.options import check_run
from dpsql.store.results import Candidate, Explanation
from dpsql.sql.compile import compile_blocks
from dpsql.strategies.spec import parse

#: option -> (kind, help)
OPTIONS = {
    "rounds": "integer >= 1, rule (the default) or auto",
    "iterate": "last|average",
    "replay": "integer 0..1000",
    "init_share": "number in [0, 1)",
    "init": "histogram|marginals",
    "cuboids": "true|false",
    "measure": "query|partition",
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
    if key == "rounds" and lower in ("rule", "auto"):
        return lower
    if key in ("rounds", "replay"):
        if kind != "number" or not text.isdigit():
            raise StrategyError(f"mwem option {key!r} needs an integer, got {text!r}")
        return int(text)
    if key in ("iterate", "init", "measure"):
        return lower
    if key == "cuboids":
        if lower not in ("true", "false"):
            raise StrategyError(f"mwem option 'cuboids' needs true or false, got {text!r}")
        return lower == "true"
    if kind != "number":
        raise StrategyError(f"mwem option {key!r} needs a number, got {text!r}")
    return number_from_text(text, f"mwem option {key!r}", "0.5", StrategyError)


def _rounds_shown(options: MWEMOptions, eps_rounds, total, blocks: int) -> tuple[int, str]:
    """The T an explanation's bound uses, and how it was chosen: the given T; the default
    rule's T when the row count is public (otherwise the rule's T depends on the run's own
    noisy estimate of N, and T = 10 is shown); 10 for the doubling rule."""
    if isinstance(options.rounds, int):
        return options.rounds, f"T = {options.rounds}"
    if options.rounds == "rule" and total is not None:
        T = defaults.default_rounds(eps_rounds, total, blocks)
        return T, defaults.describe(eps_rounds, total, blocks, T)
    if options.rounds == "rule":
        return 10, ("T = 10 shown; the default rule picks T from ε and the run's noisy "
                    "estimate of the row count")
    return 10, "T = 10 shown; rounds=auto picks T by doubling"


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
        blocks.append(Block(workload.W, groups, workload.n_cells, shape=workload.shape))
    return compiled, blocks


def explain_mwem(policy, compiled, eps, options: MWEMOptions, strategy: str) -> Explanation:
    """MWEM's explanation: no expected RMSE (data-dependent), Theorem 2.3's bound instead."""
    n_queries = sum(w.n_queries for w, _ in compiled)
    sizes = [w.n_cells for w, _ in compiled]
    share = 1 - options.init_share - (options.total_share or 0)
    eps_rounds = Fraction(eps) * share
    total = policy.rows
    rounds, t_text = _rounds_shown(options, eps_rounds, total, len(compiled))
    per_record = mwem_error_bound(1, sizes, max(1, n_queries), rounds, eps_rounds) \
        - mwem_error_bound(0, sizes, max(1, n_queries), rounds, eps_rounds)
    constant = mwem_error_bound(0, sizes, max(1, n_queries), rounds, eps_rounds)
    if total is not None:
        bound = f"{per_record * total + constant:.4g}"
    else:
        bound = f"{per_record:.3g}·N + {constant:.4g} (N = the table's row count)"
    note = (f"data-dependent error: no expected RMSE. Paper bound (Hardt, Ligett & McSherry, "
            f"Thm 2.3; plain algorithm, {t_text}): max error <= {bound} with probability "
            f">= 95%")
    if options.init_share == 0 and options.measure == "query" and \
            any(2 <= len(w.shape) <= 4 for w, _ in compiled):
        note += ("; hint: for ranges over several columns, mwem(init=marginals, "
                 "init_share=0.5, measure=partition) usually has far lower error (1.9-9.6x "
                 "on Adult's age x hours rectangles, benchmarks/mwem_adult.py)")
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
    convex program of :func:`dpsql.mechanisms.dx.scales.dx_laplace_scales`. The comparison row is standard
    Laplace at ε·d_min (the closest pair of cells), the vanilla baseline. Queries constant on
    every cell (a total count) would get no noise under d_X; they are allowed only when the
    table declares its row count public (``rows``), else refused.
    """
    from dpsql.mechanisms.dx.scales import dx_laplace_scales
    from dpsql.policy.metric import cell_distance_graph

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


# ---------------------------------------------------------- d_X: MWEM and SmallDB requests

#: the metric model's strategies and their options
DX_STRATEGIES = {
    "dx_laplace": "no options",
    "dx_mwem": "mwem's options except total_share: rounds, iterate, replay, init_share, "
               "cuboids",
    "dx_smalldb": "size = records in the synthetic database (integer >= 1)",
}


class _PublicRows:
    """Stands for a table with a declared row count when options are checked early."""

    rows = 1
    table = "?"


def dx_strategy(strategy) -> str:
    """The metric strategy's name (``auto`` counts as ``dx_laplace``), or a refusal."""
    allowed = ("metric (d_X) releases use strategy 'auto' or 'dx_laplace' (d_X Laplace), "
               "'dx_mwem(...)' (d_X MWEM) or 'dx_smalldb(size=m)' (d_X SmallDB, tiny "
               "domains)")
    if not isinstance(strategy, str):
        raise StrategyError(f"{allowed}; got {strategy!r}")
    try:
        name, items = parse(strategy)
    except StrategyError as exc:
        raise StrategyError(f"{allowed}; {exc}") from None
    name = "dx_laplace" if name == "auto" else name
    if name not in DX_STRATEGIES:
        raise StrategyError(f"{allowed}; got {strategy!r}")
    if name == "dx_laplace" and items:
        raise StrategyError(f"{strategy.strip()!r}: dx_laplace and auto take no options")
    return name


def check_dx_spec(strategy) -> str:
    """Validate a metric strategy and its options without a policy (interfaces call this
    on SET); returns the spec, stripped. Raises :class:`StrategyError`."""
    name = dx_strategy(strategy)
    if name == "dx_mwem":
        dx_mwem_options(strategy, _PublicRows)
    elif name == "dx_smalldb":
        smalldb_size(strategy)
    return strategy.strip()


def _need_rows(policy, name: str) -> None:
    if policy.rows is None:
        raise PolicyError(
            f"{name} releases a synthetic distribution scaled to the table's row count; "
            f"declare it public (rows = ... in table {policy.table!r}'s policy: under the "
            "metric model the row count never changes between neighbours), or use dx_laplace")


def dx_mwem_options(spec: str, policy) -> MWEMOptions:
    """MWEM options of a ``dx_mwem(...)`` spec; N is the policy's public ``rows``."""
    for key, _, _ in parse(spec)[1]:
        if key not in OPTIONS or key == "total_share":
            raise StrategyError(f"dx_mwem has no option {key!r}; allowed: "
                                f"{DX_STRATEGIES['dx_mwem']} (N is the declared row count)")
    _need_rows(policy, "dx_mwem")
    return mwem_options(spec, policy)


def smalldb_size(spec: str) -> int:
    items = parse(spec)[1]
    keys = [k for k, _, _ in items]
    if keys != ["size"]:
        raise StrategyError(f"dx_smalldb takes exactly one option, size = the number of "
                            f"records of the synthetic database, e.g. dx_smalldb(size=20); "
                            f"got {spec.strip()!r}")
    kind, text = items[0][1], items[0][2]
    if kind != "number" or not text.isdigit() or int(text) < 1:
        raise StrategyError(f"dx_smalldb option 'size' needs an integer >= 1, got {text!r}")
    return int(text)


def _need_metric(policy) -> None:
    if policy.metric is None:
        raise PolicyError(f"table {policy.table!r} declares no metric model; add a "
                          f"[tables.{policy.table}.metric] section to its policy for metric "
                          "(d_X) releases")


def _metric_graph(policy, workload):
    from dpsql.policy.metric import cell_distance_graph

    _need_metric(policy)
    return cell_distance_graph(policy.metric, workload.partitions, policy)


def _constant_batch(name: str):
    return StrategyError(f"{name}: every query counts the same on every cell (e.g. only total "
                         "counts), so under metric privacy there is nothing to select; use "
                         "dx_laplace with the row count declared public")


def _data_dependent(strategy, eps, mechanism, n_queries, n_cells, statements, table,
                    note, lipschitz) -> Explanation:
    cand = Candidate(strategy, math.nan, lipschitz, math.nan, np.zeros(0), note=note,
                     mechanism=mechanism)
    return Explanation(table, float(eps), 0.0, strategy, math.nan, math.nan,
                       np.full(n_queries, math.nan), n_queries, n_cells, (cand,),
                       tuple(sorted(statements)), mechanism=mechanism)


def dx_mwem_plan(policy, queries, eps, strategy: str):
    """``(explanation, options, compiled blocks, MWEM blocks, cell graphs)`` of a d_X MWEM
    request (Kamalaruban et al., Algorithm 2). Public only."""
    from dpsql.mechanisms.dx.mechanisms import PairDifferences, dx_mwem_error_bound

    _need_metric(policy)
    options = dx_mwem_options(strategy, policy)
    compiled, blocks = blocks_for(queries, policy)
    if not all(isinstance(b, Block) for b in blocks):     # the metric oracle's candidates
        raise StrategyError("internal error: d_X MWEM needs explicit candidate rows (Block)")
    check_run(blocks, eps, options, strategy)   # spends' ε and run time: before any charge
    graphs = [_metric_graph(policy, w) for w, _ in compiled]
    c = 0.0
    for block, graph in zip(blocks, graphs):
        if block.n_queries == 0:
            continue
        diffs = PairDifferences(block.W, graph)
        c = max(c, float(diffs.rows().max(initial=0.0)))
        if options.cuboids and block.groups:
            c = max(c, float(diffs.groups(*zip(*block.groups)).max(initial=0.0)))
    if not c > 0:
        raise _constant_batch("dx_mwem")
    n_queries = sum(w.n_queries for w, _ in compiled)
    sizes = [w.n_cells for w, _ in compiled]
    eps_rounds = Fraction(eps) * (1 - options.init_share)
    rounds, t_text = _rounds_shown(options, eps_rounds, policy.rows, len(compiled))
    bound = dx_mwem_error_bound(policy.rows, sizes, max(1, n_queries), rounds, eps_rounds, c)
    note = (f"data-dependent error: no expected RMSE. Paper bound (Kamalaruban et al. Thm 5 = "
            f"Hardt et al. Thm 2.3 at ε/c; plain algorithm, {t_text}): max error <= "
            f"{bound:.4g} with probability >= 95%; score Lipschitz constant c = {c:.4g} per "
            f"unit distance (c = 1: standard change-one DP)")
    statements = [(o.query.index, o.start, o.stop) for w, _ in compiled for o in w.outputs]
    expl = _data_dependent(strategy, eps, "dx_mwem", n_queries,
                           int(np.prod(sizes, dtype=float)), statements, policy.table, note, c)
    return expl, options, compiled, blocks, graphs


def dx_smalldb_plan(policy, workload, eps, strategy: str):
    """``(explanation, size, cell graph)`` of a d_X SmallDB request (Kamalaruban et al.
    §3.2): refused above :data:`dpsql.mechanisms.dx.mechanisms.MAX_SMALLDB_CANDIDATES` candidates."""
    from dpsql.mechanisms.dx.mechanisms import PairDifferences, check_smalldb, smalldb_error_bound

    graph = _metric_graph(policy, workload)
    size = smalldb_size(strategy)
    _need_rows(policy, "dx_smalldb")
    count = check_smalldb(workload.n_cells, size)
    W = workload.W
    if W.nnz and not np.all(W.data == np.round(W.data)):
        raise StrategyError("dx_smalldb supports counting queries (integer weights) only")
    c = float(PairDifferences(W, graph).rows().max(initial=0.0))
    if not c > 0:
        raise _constant_batch("dx_smalldb")
    bound = smalldb_error_bound(policy.rows, workload.n_queries, size, count, eps, c)
    note = (f"data-dependent error: no expected RMSE. Bound (Kamalaruban et al. Prop. 4 / "
            f"Thm 2; {count:,} candidate databases of {size} records): max error <= "
            f"{bound:.4g} with probability >= 95%; score Lipschitz constant c = {c:.4g} per "
            "unit distance")
    statements = [(o.query.index, o.start, o.stop) for o in workload.outputs]
    expl = _data_dependent(strategy, eps, "dx_smalldb", workload.n_queries, workload.n_cells,
                           statements, policy.table, note, c)
    return expl, size, graph
