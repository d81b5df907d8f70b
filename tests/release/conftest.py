"""Fixtures shared by the release tests."""

from __future__ import annotations

import pytest

from tests.conftest import make_adult_db


@pytest.fixture
def db(tmp_path):
    """A fresh protected Adult database with budget for several requests (epsilon 10,
    delta 1e-3): the planning-limit tests (test_limits, test_implicit_limits,
    test_request_limits) share it. Files that need another policy define their own ``db``,
    which overrides this one."""
    session = make_adult_db(str(tmp_path / "adult.duckdb"), epsilon=10.0, delta=1e-3)
    yield session
    session.close()
