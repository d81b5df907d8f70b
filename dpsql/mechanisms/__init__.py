"""Mechanisms: how a request is planned and measured (matrix mechanism, answers from past releases, MWEM, d_X)."""
