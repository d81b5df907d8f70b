"""The answers of a joint release, per statement: COUNT and SUM as measured, AVG as a ratio.

Post-processing of released values only (no data, no budget).

``AVG(v)`` over a group is ``Ŝ / Ĉ``: the noisy ``SUM(v)`` and the noisy ``COUNT(v)`` of the
same rows, from the same release but different blocks, whose noises are independent. Its
standard error is the delta method's, at the noisy values:

    se(Ŝ/Ĉ)² ≈ se_S² / Ĉ² + Ŝ² se_C² / Ĉ⁴

(the first-order Taylor expansion of ``S/C`` around the noisy answers; exact covariance 0
between the blocks), and its 95% interval ``Ŝ/Ĉ ± 1.96 se``. Two documented rules:

- **never divide by a noisy count ≤ 0**: where ``Ĉ ≤ 0`` the AVG is NULL (its standard error
  and interval too), and the result table's comment says how many;
- an average of values clamped to ``[lo, hi]`` (NULL and unreadable values counting as 0)
  lies in ``[min(lo, 0), max(hi, 0)]``: the estimate and both ends of its interval are
  clipped to that range (post-processing; the interval cannot lose the true value).

The delta method is an approximation: it is honest when the count is large against its
noise (coverage measured at 94–96%, ``tests/release/test_sums.py``) and optimistic for
groups whose noisy count is near 0.
"""

from __future__ import annotations

import numpy as np

Z95 = 1.959963984540054  # Φ⁻¹(0.975), as in dpsql.store.results


def assemble(kinds, numerator, denominator, answers, stderr, halfwidth, ranges):
    """Per answer of the batch: ``(value, stderr, ci_low, ci_high, n_null)``.

    ``numerator[r] = (vector, row)`` locates answer ``r`` in the per-vector ``answers``,
    ``stderr`` and ``halfwidth`` (lists of arrays); an AVG's ``denominator[r]`` is its
    count's. ``ranges[r]``: the AVG's ``(low, high)`` clip range (None otherwise)."""
    m = len(kinds)
    value, se = np.empty(m), np.empty(m)
    low, high = np.empty(m), np.empty(m)
    n_null = 0
    for r in range(m):
        v, i = numerator[r]
        a, s, h = answers[v][i], stderr[v][i], halfwidth[v][i]
        if kinds[r] != "avg":
            value[r], se[r], low[r], high[r] = a, s, a - h, a + h
            continue
        c, j = denominator[r]
        got = ratio(a, s, answers[c][j], stderr[c][j], ranges[r])
        n_null += int(np.isnan(got[0]))
        value[r], se[r], low[r], high[r] = got
    return value, se, low, high, n_null


def ratio(total: float, total_se: float, count: float, count_se: float, clip) -> tuple:
    """``(avg, stderr, low, high)`` of ``total / count`` (module docstring), NaN when the
    noisy count is ≤ 0."""
    if not count > 0:
        return np.nan, np.nan, np.nan, np.nan
    avg = total / count
    se = float(np.sqrt(total_se ** 2 / count ** 2 + total ** 2 * count_se ** 2 / count ** 4))
    lo, hi = clip
    return (float(np.clip(avg, lo, hi)), se, float(np.clip(avg - Z95 * se, lo, hi)),
            float(np.clip(avg + Z95 * se, lo, hi)))


def comment(kinds, n_null: int) -> str | None:
    """The result tables' comment on AVG answers (None when the batch has none)."""
    if "avg" not in kinds:
        return None
    text = ("AVG = SUM / COUNT of the same release; standard error by the delta method; "
            "estimate and interval clipped to the values' range")
    if n_null:
        text += (f"; {n_null} AVG answer(s) NULL: their noisy COUNT was <= 0 (dpsql never "
                 "divides by a noisy count <= 0)")
    return text
