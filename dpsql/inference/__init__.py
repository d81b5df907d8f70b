"""Inference: least squares, exact standard errors and intervals from noisy measurements (public only)."""
