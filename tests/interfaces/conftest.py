"""Fixtures shared by the interface tests: a fresh protected Adult copy and a DB-API
connection (test_dbapi.py, test_dbapi_settings.py), and a fork server for modules that run many
short ``dpsql`` commands (test_examples.py, test_cli.py)."""

from __future__ import annotations

import shutil

import pytest

from dpsql.interfaces import dbapi

from .zygote import Zygote


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


@pytest.fixture(scope="module")
def zygote(tmp_path_factory):
    """A fork server that imports dpsql once per test module: each ``dpsql`` command and
    Python block still runs in a process of its own (argv, directory, environment, streams
    and exit status), without paying a fresh interpreter's imports (seconds each)."""
    with Zygote(tmp_path_factory.mktemp("zygote")) as z:
        yield z
