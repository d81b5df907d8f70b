"""Fixtures shared by the DB-API tests (test_dbapi.py, test_dbapi_settings.py)."""

from __future__ import annotations

import shutil

import pytest

from dpsql.interfaces import dbapi


@pytest.fixture
def path(adult_template, tmp_path):
    """A fresh copy of the protected Adult test database."""
    p = str(tmp_path / "adult.duckdb")
    shutil.copyfile(adult_template, p)
    return p


@pytest.fixture
def conn(path):
    """A DB-API connection to it (ε = 0.1, δ = 1e-8), closed after the test."""
    c = dbapi.connect(path, epsilon=0.1, delta=1e-8)
    yield c
    if not c.closed:
        c.close()
