"""What past releases say about a batch compiled to Kronecker blocks (issue 16), public
inputs only.

A block on columns ``B`` is a function of the marginal on ``B``, hence of the marginal on any
clique ``K ⊇ B``: over ``K``'s cells its rows are ``√w ⊗_{i∈K} F_i`` (its own factor on
``B``, a row of ones on ``K∖B``). A stored measurement over columns ``C`` — a dense release
over the columns it touched, or one piece of an implicit release
(:func:`~dpsql.mechanisms.reuse.records.marginal_records`) — measures the marginal on ``C``,
so it informs the blocks of every region ``K ⊇ C``. The analysis therefore runs per
*region*, each block's home (the smallest of the batch's maximal cliques holding its
columns, :func:`dpsql.inference.union_kron.home`), as the dense GLS pool
(:class:`~dpsql.mechanisms.reuse.pool.Pool`: Aitken's generalised least squares in
measurement space) over the common refinement of the parts of ``K``'s columns only. Each
answer is the GLS estimate from the measurements over subsets of its region: unbiased, with
the exact variance ``w F⁺ wᵀ`` of that estimate (Gauss–Markov within those measurements;
measurements over columns outside the region are not used for it). Memory and time grow with
the regions' marginals and the number of measurements, never with the product of all
columns.

Bounded before anything large is built: the pools' predicted memory
(:func:`~dpsql.mechanisms.reuse.pool.predicted_bytes`, plus the regions' rows) may take at
most :data:`~dpsql.mechanisms.reuse.pool.MAX_SHARE` of ``max_memory`` in all, and their
predicted time (:func:`analysis_seconds`: the decompositions and the rows' weights) at most
that share of ``time_limit``; every pool is set up and priced before any is analysed. Over
either the whole analysis is skipped: the batch is
then planned exactly as without past releases (only the free answers are lost), and the
reason is returned for explain.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from dpsql.inference.union_kron import home
from dpsql.mechanisms.reuse.pool import (MAX_MEASUREMENTS, MAX_SHARE, Pool,
                                         decomposition_seconds)
from dpsql.mechanisms.reuse.records import marginal_records
from dpsql.workload import limits as planning


@dataclass(frozen=True)
class Region:
    """A region of the batch as a small batch of its own (what :class:`Pool` reads): its
    columns' partitions and its blocks' rows over the region marginal's cells."""

    columns: tuple             # column indices into the batch's partitions
    blocks: tuple              # the batch's blocks homed here
    partitions: tuple          # ColumnPartition per column of the region
    W: sp.csr_matrix


def regions(workload) -> list[Region]:
    """Every block's region (its home among the batch's maximal cliques), with its rows."""
    union = workload.union
    found = union.cliques()
    maximal = tuple(C for C in found if not any(set(C) < set(D) for D in found))
    homed: dict = {}
    for k, b in enumerate(union.blocks):
        homed.setdefault(home(maximal, b.used, union.sizes), []).append(k)
    return [Region(K, tuple(ks), tuple(workload.partitions[i] for i in K),
                   _rows(union, K, ks)) for K, ks in homed.items()]


def _rows(union, K: tuple, ks) -> sp.csr_matrix:
    """The blocks' rows over the marginal on ``K`` (C order over ``K``'s parts)."""
    out = []
    for k in ks:
        b = union.blocks[k]
        M = sp.csr_matrix(np.full((1, 1), math.sqrt(b.weight)))
        for i in K:
            M = sp.kron(M, sp.csr_matrix(b.factors[i]), format="csr")
        out.append(M)
    return sp.vstack(out, format="csr")


@dataclass
class Past:
    """The past releases' answers to an implicit batch's rows (public): per row whether it
    is estimable, its GLS variance (inf where not), and the pools that give them."""

    workload: object
    estimable: np.ndarray
    variance: np.ndarray
    release_ids: tuple
    pools: list                # (Region, Pool, its Analysis of the region's rows)

    room: float = 0.0          # the memory and time the analysis may still take
    seconds: float = 0.0

    def combine(self, sub, measured, plan, mechanism: str, scale: float) -> list:
        """Adds the new measurement's pieces (planned: ``y`` not known yet; the variances do
        not depend on it) over subsets of a region's columns to the pool of every region
        with a block ``measured`` (indices into the batch's blocks; regions whose blocks are
        all free stay answered from the past alone), where the limits allow
        (:data:`~dpsql.mechanisms.reuse.pool.MAX_MEASUREMENTS`, the memory and time left),
        and re-analyses those regions: their rows' variances are then those of one GLS over
        old and new. Returns ``[(pool, term)]`` per piece (None where not
        added), for :meth:`fill`."""
        pieces = marginal_records(0, sub, plan, np.zeros(plan.n_measurements), mechanism,
                                  scale)
        names = [p.column for p in self.workload.partitions]
        terms: list = [None] * len(pieces)
        measured = set(measured)
        for j, (region, pool, _) in enumerate(self.pools):
            if not measured & set(region.blocks):
                continue
            cols = {names[i] for i in region.columns}
            mine = [k for k, r in enumerate(pieces)
                    if {c for c, _ in r.partitions} <= cols]
            sizes = [r.A.shape[0] for r in pool.records] + \
                [pieces[k].A.shape[0] for k in mine]
            need = 24.0 * sum(sizes) ** 2
            secs = analysis_seconds(pool.records + [pieces[k] for k in mine], region.W)
            if not mine or sum(sizes) > MAX_MEASUREMENTS or need > self.room \
                    or secs > self.seconds:
                continue
            self.room, self.seconds = self.room - need, self.seconds - secs
            for k in mine:
                terms[k] = (pool, pool.add(pieces[k], own=True))
            self.pools[j] = (region, pool, pool.analyse(region.W))
        self.estimable = self._per_row(lambda r, p, a: a.estimable, 0.0) > 0
        self.variance = self._per_row(lambda r, p, a: a.variance, math.inf)
        return terms

    @staticmethod
    def fill(terms: list, sub, plan, y, mechanism: str, scale: float) -> None:
        """The measured values of the pieces :meth:`combine` added."""
        pieces = marginal_records(0, sub, plan, y, mechanism, scale)
        for term, rec in zip(terms, pieces):
            if term is not None:
                term[0].set_y(term[1], rec.y)

    def _per_row(self, value, fill: float) -> np.ndarray:
        """The batch's rows of ``value(region, pool, analysis)`` (per region row), ``fill``
        elsewhere."""
        blocks = self.workload.union.blocks
        per_block = [np.full(b.shape[0], fill) for b in blocks]
        for region, pool, analysis in self.pools:
            got, start = np.asarray(value(region, pool, analysis), dtype=float), 0
            for k in region.blocks:
                stop = start + blocks[k].shape[0]
                per_block[k] = got[start:stop]
                start = stop
        return self.workload.assemble(per_block)

    def answers(self) -> np.ndarray:
        """Each row's GLS answer from past releases (NaN where not estimable)."""
        out = self._per_row(lambda r, p, a: p.answers(r.W), math.nan)
        return np.where(self.estimable, out, math.nan)

    def halfwidths(self) -> np.ndarray:
        """Each row's 95% half-width (the pool's rule for its noise families)."""
        return self._per_row(lambda r, p, a: p.halfwidths(r.W, a.variance), math.inf)


def analyse(policy, workload, records) -> tuple[Past | None, str]:
    """``(past, '')``; ``(None, why)`` when the analysis is skipped for its cost; ``(None,
    '')`` when no stored measurement informs the batch. Every region's pool is set up (its
    refinement and aggregations, each within the memory left) and its time predicted
    before any is analysed, so a skip costs little."""
    names = [p.column for p in workload.partitions]
    limit = planning.current()
    room, seconds = limit.max_memory * MAX_SHARE, limit.time_limit * MAX_SHARE
    found = []
    for region in regions(workload):
        cols = {names[i] for i in region.columns}
        mine = [r for r in records if {c for c, _ in r.partitions} <= cols]
        if not mine:
            continue
        room -= 16 * region.W.nnz + 8 * region.W.shape[0]
        pool = Pool(policy, region, mine, room=max(room, 0.0), spare=0)
        if pool.too_costly or room < 0:
            return None, _skipped("memory", limit)
        if pool.records:
            room -= pool.need
            seconds -= analysis_seconds(pool.records, region.W)
            found.append((region, pool))
    if seconds < 0:
        return None, _skipped("time", limit)
    if not found:
        return None, ""
    pools = [(region, pool, pool.analyse(region.W)) for region, pool in found]
    past = Past(workload, np.zeros(workload.n_queries, bool), np.full(workload.n_queries,
                math.inf), tuple(sorted({i for _, p, _ in pools for i in p.release_ids})),
                pools, room, seconds)
    past.estimable = past._per_row(lambda r, p, a: a.estimable, 0.0) > 0
    past.variance = past._per_row(lambda r, p, a: a.variance, math.inf)
    return past, ""


def analysis_seconds(recs, W) -> float:
    """Predicted seconds of a region's analysis: the decomposition
    (:func:`~dpsql.mechanisms.reuse.pool.decomposition_seconds`) plus the rows' weights
    (``W M̃ᵀ``: ``2·nnz(W)·m``; times ``G⁺``: ``2·q·m²``) at the dense rate."""
    sizes = [r.A.shape[0] for r in recs]
    m = float(sum(sizes))
    weights = (2.0 * W.nnz * m + 2.0 * W.shape[0] * m * m) / planning.FLOPS
    return decomposition_seconds(sizes, [r.A.nnz for r in recs]) + weights


def _skipped(what: str, limit) -> str:
    share = f"{MAX_SHARE:.3g}"
    bound = (f"{share} of max_memory = {planning.show_bytes(limit.max_memory)}"
             if what == "memory" else f"{share} of time_limit = {limit.time_limit:g} s")
    return (f"skipped: combining past releases over this batch's cliques would need more "
            f"than {bound}; the batch is planned afresh (the same answers, only none free)")
