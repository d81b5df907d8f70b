"""Noise: secure exact samplers, calibration of their scales, and exact privacy accounting."""
