"""Mechanisms: MWEM, d_X, answers from past releases, accuracy first, consistency."""
