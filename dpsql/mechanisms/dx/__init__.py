"""Metric (d_X) mechanisms: per-query scales, the d_X exponential mechanism, d_X MWEM and SmallDB."""
