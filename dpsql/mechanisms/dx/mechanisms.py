"""d_X-private selection: the exponential mechanism, and the pieces of d_X MWEM and SmallDB.

Kamalaruban et al., "d_X-private mechanisms for linear queries" (NOTES.md, d_X), §3.2. The
model is :mod:`dpsql.policy.record_metric`'s: neighbours differ in ONE record moving from cell ``i`` to
cell ``j``, and a mechanism must keep every output's probability within ``exp(ε·d(i, j))``.

**Score sensitivity per pair.** A score ``u(x, r)`` of candidate ``r`` has, for the pair
``(i, j)``, the sensitivity ``Δ_ij u = max_{x, r} |u(x, r) − u(x', r)|`` with ``x' = x − e_i
+ e_j`` (Definition 5). Everything here is linear in the counts: a candidate's score is a
function of ``S_r x`` for some rows ``S_r``, Lipschitz in L1 (MWEM: ``Σ_k |est_k − S_k x|``)
or in L∞ (SmallDB: ``max_k |S_k x − c_k|``), so ``Δ_ij ≤ Σ_k |S[k,i] − S[k,j]|`` (resp.
``max_k``). :class:`PairDifferences` computes, per candidate, the **Lipschitz constant**

    ``c_r = max over pairs (i, j) of Δ_ij(r) / d(i, j)``,

the factor of the task's "bounded by d(i, j) times a factor". ``Δ(r)`` is a pseudometric on
the cells (a sum or max of ``|S[k,i] − S[k,j]|``), so, exactly as for d_X Laplace
(:mod:`dpsql.policy.metric`, points 1–3), the maximum over the edges of the cell graph is the
maximum over all pairs: along a shortest path
``Δ(i,j) ≤ Σ Δ(edge) ≤ c Σ d(edge) = c·D*(i,j)``.

**The d_X exponential mechanism** (Definition 9, Theorem 1): output ``r`` with probability
``∝ exp(ε·u(x, r) / (2c))``, ``c = max_r c_r``. For neighbours ``i → j`` every score moves by
at most ``c·d(i, j)``: the numerator of ``P[r]`` moves by a factor at most
``exp(ε·c·d/(2c))`` and the normaliser by at most the same, so ``P[r] / P'[r] ≤
exp(ε·d(i, j))`` — d_X-private at ``ε`` per unit distance. With ``d = 1`` for every pair of
distinct cells, ``c`` is the usual (change-one) sensitivity and this is McSherry & Talwar's
mechanism. It is sampled with the kernel's sampler (OpenDP's exact Gumbel report-noisy-max,
:func:`dpsql.noise.laplace.secure_exponential`, with ``sensitivity = c``; its scale rounds up, which
only adds privacy).

**SmallDB** (§3.2, Proposition 3; Blum, Ligett & Roth; Dwork & Roth Algorithm 4): the
exponential mechanism over every histogram ``y`` of ``m`` records on the cells, score
``−max_k |W_k x − (N/m)·W_k y|``, Lipschitz constant ``max_k`` form of ``W``. There are
``C(n + m − 1, m)`` candidates, exponential in the domain, so dpsql refuses above
:data:`MAX_SMALLDB_CANDIDATES`. Scores are computed exactly (integers scaled by ``m``).

**MWEM** (Algorithm 2, Theorem 4) is :func:`dpsql.mechanisms.mwem.core.run_mwem` against the kernel's
metric oracle (:class:`dpsql.kernel.metric_oracle.MetricMeasureOracle`), whose selection is this
exponential mechanism and whose measurement is d_X Laplace with ``b = c_R/ε_i``.

Public inputs only: no data is read here (the kernel applies :func:`smalldb_scores` to the
counts).
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import scipy.sparse as sp

from dpsql.noise.accounting import validate_epsilon
from dpsql.mechanisms.dx.scales import _FLOAT_SLACK, _differences, _pairs
from dpsql.errors import StrategyError
from dpsql.policy.metric import CellGraph
from dpsql.mechanisms.mwem.core import mwem_error_bound

#: dx_smalldb refuses when there are more candidate databases C(n + m − 1, m) than this
#: (scoring them is O(candidates × queries); at the limit about a second for 50 queries)
MAX_SMALLDB_CANDIDATES = 200_000


def _round_up(values: np.ndarray) -> np.ndarray:
    """Float bounds made safe against the few roundings that produced them (a sum of exact
    grid values, one division by a distance rounded down): a relative 4e-12 and one ulp."""
    values = np.asarray(values, dtype=float)
    return np.where(values > 0, np.nextafter(values * (1 + 4 * _FLOAT_SLACK), np.inf), 0.0)


# ------------------------------------------------------------- score Lipschitz constants

class MetricPairs(tuple):
    """``(I, J, d, n_cells)``: the constraint pairs of a cell metric and their distances."""


def metric_pairs(graph_or_distances) -> MetricPairs:
    """The pairs to check: a :class:`~dpsql.policy.metric.CellGraph`'s edges (they suffice, see the
    module docstring) or every pair of a dense distance matrix (validated)."""
    method = "auto" if isinstance(graph_or_distances, CellGraph) else "pairs"
    I, J, d = _pairs(graph_or_distances, method)[:3]
    n = (graph_or_distances.n_cells if isinstance(graph_or_distances, CellGraph)
         else np.asarray(graph_or_distances).shape[0])
    d = np.asarray(d, dtype=float)
    if len(d) and not (d > 0).all():
        raise StrategyError("two distinct cells are at distance 0: no finite temperature "
                            "separates them")
    return MetricPairs((I, J, d, int(n)))


class PairDifferences:
    """``|S[k,i] − S[k,j]|`` for every constraint pair of a cell metric and every row ``k``.

    ``graph_or_distances``: a :class:`~dpsql.policy.metric.CellGraph` (its edges suffice, see the
    module docstring), a dense distance matrix (every pair) or their :func:`metric_pairs`.
    Built once per matrix; the Lipschitz constants of any row groups then cost one sparse
    product.
    """

    def __init__(self, S, graph_or_distances):
        I, J, d, n = (graph_or_distances if isinstance(graph_or_distances, MetricPairs)
                      else metric_pairs(graph_or_distances))
        S = sp.csr_matrix(S, dtype=float)
        if S.shape[1] != n:
            raise StrategyError(f"the scores have {S.shape[1]} cells but the metric covers {n}")
        self.n_rows = S.shape[0]
        self._d = d
        self._A = _differences(S, I, J) if len(I) else sp.csr_matrix((0, self.n_rows))
        self._rows = None

    @property
    def d_min(self) -> float:
        return float(self._d.min()) if self._d.size else math.inf

    def rows(self) -> np.ndarray:
        """Per row ``k``: ``max_pairs |S[k,i] − S[k,j]| / d(i, j)``, rounded up."""
        if self._rows is None:
            out = np.zeros(self.n_rows)
            A = self._A.tocoo()
            if A.nnz:
                np.maximum.at(out, A.col, A.data / self._d[A.row])
            self._rows = _round_up(out)
        return self._rows

    def groups(self, starts, stops) -> np.ndarray:
        """Per row group ``starts[g]:stops[g]``: ``max_pairs Σ_k |S[k,i] − S[k,j]| / d``
        (the L1 form: MWEM's group score and a group's Laplace measurement), rounded up."""
        starts = np.asarray(starts, dtype=np.int64).reshape(-1)
        stops = np.asarray(stops, dtype=np.int64).reshape(-1)
        if starts.size == 0:
            return np.zeros(0)
        if np.all(stops - starts == 1):
            return self.rows()[starts]
        lengths = stops - starts
        rows = np.concatenate([np.arange(a, b) for a, b in zip(starts, stops)])
        G = sp.csr_matrix((np.ones(rows.size), (rows, np.repeat(np.arange(starts.size),
                                                                lengths))),
                          shape=(self.n_rows, starts.size))
        sums = (self._A @ G).tocoo()          # pairs × groups; exact sums of grid values
        out = np.zeros(starts.size)
        if sums.nnz:
            np.maximum.at(out, sums.col, sums.data / self._d[sums.row])
        return _round_up(out)

    def total(self) -> float:
        """All rows as one group: the Lipschitz constant of ``‖S x − S x'‖₁`` (Laplace)."""
        return float(self.groups([0], [self.n_rows])[0]) if self.n_rows else 0.0


def score_lipschitz(S, graph_or_distances, form: str = "max") -> float:
    """``max_pairs Δ_ij / d(i, j)`` for scores bounded by the rows of ``S``: ``form="max"``
    (each candidate ``r`` is one row, ``|u(x,r) − u(x',r)| ≤ |S[r,i] − S[r,j]|``, as in
    :func:`dpsql.mechanisms.dx.scales.dx_exponential_epsilon`; also SmallDB's ``max_k`` score) or ``"sum"``
    (one candidate whose score moves by ``Σ_k |S[k,i] − S[k,j]|``). Rounded up."""
    diffs = PairDifferences(S, graph_or_distances)
    if form == "max":
        return float(diffs.rows().max()) if diffs.n_rows else 0.0
    if form == "sum":
        return diffs.total()
    raise StrategyError(f"form must be 'max' or 'sum', got {form!r}")


# ------------------------------------------------------------ the exponential mechanism

def _lipschitz(value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not math.isfinite(float(value)) or float(value) <= 0:
        raise StrategyError(f"the score Lipschitz constant must be a finite number > 0, got "
                            f"{value!r} (0 means no score depends on the data: pick any "
                            "candidate)")
    return float(value)


def dx_exponential(scores, epsilon_per_unit, lipschitz, *, sampler=None) -> int:
    """Select a candidate with probability ``∝ exp(ε·score / (2·lipschitz))``.

    d_X-private at ``epsilon_per_unit`` when, for every pair of cells ``(i, j)`` and every
    candidate, moving one record from ``i`` to ``j`` changes the candidate's score by at most
    ``lipschitz · d(i, j)`` (Kamalaruban et al. §3.2, Definition 9 and Theorem 1): each
    numerator ``exp(ε s_r/(2c))`` and the normaliser move by at most ``exp(ε d/2)``, so every
    probability ratio is at most ``exp(ε·d(i, j))``. Get ``lipschitz`` from
    :class:`PairDifferences` / :func:`score_lipschitz`, never from the data.

    ``sampler``: anything with ``exponential(scores, epsilon, *, sensitivity)``; default the
    secure exact sampler (OpenDP's Gumbel report-noisy-max, which draws exactly these
    probabilities with its scale ``2c/ε`` rounded up). Tests pass
    :class:`dpsql.noise.samplers.SeededTestSampler`.
    """
    eps = validate_epsilon(epsilon_per_unit)
    c = _lipschitz(lipschitz)
    s = np.asarray(scores, dtype=float)
    if s.ndim != 1 or s.size == 0 or not np.all(np.isfinite(s)):
        raise StrategyError("dx_exponential needs a non-empty 1-D array of finite scores")
    if sampler is None:
        from dpsql.noise.samplers import SecureSampler

        sampler = SecureSampler()
    k = sampler.exponential(s, eps, sensitivity=c)
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 0 <= k < s.size:
        raise StrategyError(f"the sampler returned {k!r}; expected an index in [0, {s.size})")
    return int(k)


def dx_exponential_log_probabilities(scores, epsilon_per_unit, lipschitz) -> np.ndarray:
    """The natural-log probabilities :func:`dx_exponential` is meant to draw (float,
    log-sum-exp), for tests and explanations."""
    eps = float(validate_epsilon(epsilon_per_unit))
    z = eps * np.asarray(scores, dtype=float) / (2.0 * _lipschitz(lipschitz))
    z = z - z.max()
    return z - math.log(float(np.exp(z).sum()))


# ------------------------------------------------------------------------------ SmallDB

def smalldb_count(n_cells: int, size: int) -> int:
    """``C(n + m − 1, m)``: the histograms of ``m`` records over ``n`` cells."""
    return math.comb(int(n_cells) + int(size) - 1, int(size))


def check_smalldb(n_cells: int, size: int) -> int:
    """The candidate count, or a refusal naming it when it is above the limit."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise StrategyError(f"dx_smalldb needs size = an integer >= 1 (records in the "
                            f"synthetic database), got {size!r}")
    count = smalldb_count(n_cells, size)
    if count > MAX_SMALLDB_CANDIDATES:
        raise StrategyError(
            f"dx_smalldb(size={size}) over {n_cells:,} cells would score C({n_cells} + {size} "
            f"- 1, {size}) = {count:,} candidate databases, more than the limit of "
            f"{MAX_SMALLDB_CANDIDATES:,} (SmallDB enumerates them all: exponential in the "
            "domain); use a smaller size or coarser queries, or strategy dx_laplace")
    return count


def smalldb_candidates(n_cells: int, size: int) -> sp.csr_matrix:
    """Every histogram of ``size`` records over ``n_cells`` cells, one per row (counts).

    Enumerated as multisets (``combinations_with_replacement``, tuples of length ``m``) or,
    when shorter, by stars and bars (bar positions, tuples of length ``n − 1``)."""
    count = check_smalldb(n_cells, size)
    n, m = int(n_cells), int(size)
    if n == 1:
        return sp.csr_matrix(np.full((1, 1), float(m)))
    if m <= n - 1:
        combos = itertools.combinations_with_replacement(range(n), m)
        cols = np.fromiter(itertools.chain.from_iterable(combos), dtype=np.int64,
                           count=count * m)
        rows = np.repeat(np.arange(count), m)
        Y = sp.csr_matrix((np.ones(cols.size), (rows, cols)), shape=(count, n))
        Y.sum_duplicates()
        return Y
    bars = np.fromiter(itertools.chain.from_iterable(
        itertools.combinations(range(n + m - 1), n - 1)), dtype=np.int64,
        count=count * (n - 1)).reshape(count, n - 1)
    edges = np.hstack([np.full((count, 1), -1), bars, np.full((count, 1), n + m - 1)])
    return sp.csr_matrix(np.diff(edges, axis=1) - 1, dtype=float)


def _integral(W: sp.csr_matrix) -> bool:
    return bool(np.all(W.data == np.round(W.data)))


def smalldb_scores(W, x, Y, size: int, total: int) -> np.ndarray:
    """Scores of the candidates ``Y`` (rows) in units of ``1/size`` of a count, exactly:
    ``−max_k |size·(W x)_k − total·(W y)_k|`` = ``size ×`` SmallDB's score
    ``−max_k |W_k x − (N/m)·W_k y|``. Integer arithmetic in float64 (``W`` integral, products
    below 2**53, checked), so the score sensitivity argument holds without rounding."""
    W = sp.csr_matrix(W, dtype=float)
    Y = sp.csr_matrix(Y, dtype=float)
    x = np.asarray(x, dtype=float).reshape(-1)
    if not (_integral(W) and _integral(Y) and np.all(x == np.round(x))):
        raise StrategyError("internal error: SmallDB scores need integral queries and counts")
    answers = np.asarray(W @ x, dtype=float).reshape(-1)
    scale = float(np.abs(W).sum(axis=1).max()) if W.nnz else 0.0
    top = max(float(np.abs(answers).max(initial=0)) * size, scale * size * float(total))
    if not top < 2.0 ** 53:
        raise StrategyError("the SmallDB scores would exceed exact float arithmetic (size × "
                            "rows too large); use a smaller size")
    target = size * answers
    out = np.empty(Y.shape[0])
    step = max(1, int(5_000_000 // max(1, W.shape[0])))
    for start in range(0, Y.shape[0], step):
        synth = np.asarray((W @ Y[start:start + step].T).todense(), dtype=float)
        out[start:start + step] = -np.max(np.abs(target[:, None] - total * synth), axis=0,
                                          initial=0.0)
    return out


def smalldb_error_bound(n_total, n_queries: int, size: int, n_candidates: int, epsilon,
                        lipschitz: float, beta: float = 0.05) -> float:
    """Max query error of d_X SmallDB with probability ``≥ 1 − β`` (counts).

    ``N·min(1, √(ln(2|Q|) / (2m)))`` — some histogram of ``m`` records is that close to the
    data on every query (sample ``m`` records: Hoeffding per query and a union bound; Dwork &
    Roth Theorem 4.2) — plus the exponential mechanism's loss
    ``(2c/ε)(ln |R| + ln(1/β))`` over ``|R|`` candidates with Lipschitz constant ``c``
    (Kamalaruban et al. Theorem 2, Proposition 4)."""
    eps = float(validate_epsilon(epsilon))
    approx = float(n_total) * min(1.0, math.sqrt(math.log(2 * max(1, n_queries)) / (2 * size)))
    return approx + 2 * lipschitz / eps * (math.log(n_candidates) + math.log(1 / beta))


def dx_mwem_error_bound(n_total, n_cells, n_queries, rounds, epsilon, lipschitz,
                        beta: float = 0.05) -> float:
    """MWEM's bound (:func:`dpsql.mechanisms.mwem.core.mwem_error_bound`, Hardt et al. Thm 2.3) for the d_X
    variant: its noise terms scale with the score / measurement Lipschitz constant ``c``
    (temperature ``4Tc/ε``, Laplace scale ``2Tc/ε``), i.e. the standard bound at ``ε/c``
    (Kamalaruban et al. Theorems 4–5)."""
    eps = Fraction(validate_epsilon(epsilon)) / Fraction(_lipschitz(lipschitz))
    return mwem_error_bound(n_total, n_cells, n_queries, rounds, eps, beta)


__all__ = ["MAX_SMALLDB_CANDIDATES", "MetricPairs", "PairDifferences", "check_smalldb",
           "dx_exponential", "dx_exponential_log_probabilities", "dx_mwem_error_bound",
           "metric_pairs", "score_lipschitz", "smalldb_candidates", "smalldb_count",
           "smalldb_error_bound", "smalldb_scores"]
