"""Error oracles and data-dependent output shape on neighbouring tables (items 8 and 9 of the
adversarial suite). Helpers in ``hostile.py``."""

from __future__ import annotations

import pytest


from tests.conftest import snapshot
from tests.privacy.hostile import Recorder, memory_conn, via_dbapi, via_python
from tests.sql.statements import statements


# =========================================================================== items 8, 9
# Error oracles and data-dependent output shape. Neighbouring tables: `full` (the Adult
# extract), `minus_one` (one age-90 row removed), `plus_one` (one hostile row added: age 90,
# sex '(' (undeclared), race NULL). `emptied` (every 'Other' race and every age >= 85 row
# removed) is not a neighbour: it shows empty declared groups are still returned.

NEIGHBOURS = {
    "full": (),
    "minus_one": ("DELETE FROM adult WHERE rowid = (SELECT min(rowid) FROM adult "
                  "WHERE age = 90)",),
    "plus_one": ("INSERT INTO adult (age, sex, race, income, hours_per_week) "
                 "VALUES (90, '(', NULL, '>50K', 99)",),
    "emptied": ("DELETE FROM adult WHERE race = 'Other' OR age >= 85",),
}


@pytest.fixture(scope="module")
def neighbours():
    """name -> DB-API connection (``.session``: the Python API) on that table, in memory."""
    conns = {name: memory_conn(setup) for name, setup in NEIGHBOURS.items()}
    yield conns
    for conn in conns.values():
        conn.close()


#: item 8: predicates that could make DuckDB raise for some data values
ORACLES = statements("adult_reject.sql", "refuse", "oracle")
#: item 9: output shape that would depend on the data
SHAPES_REFUSED = statements("adult_reject.sql", "refuse", "shape")


@pytest.mark.parametrize("sql", ORACLES + SHAPES_REFUSED)
def test_refusal_is_identical_on_neighbouring_tables(neighbours, monkeypatch, sql):
    """Passing: on each neighbouring table the Python API and the DB-API refuse, with the very
    same message (so the refusal carries no information about the rows), without reading the
    data vector, and nothing is charged."""
    sessions = [conn.session for conn in neighbours.values()]
    before = [snapshot(s) for s in sessions]
    rec = Recorder(monkeypatch, *sessions)
    seen = {(via_python(conn.session, sql).message, via_dbapi(conn, sql).message)
            for conn in neighbours.values()}
    monkeypatch.undo()
    assert len(seen) == 1, seen
    (python_msg, dbapi_msg), = seen
    assert python_msg and python_msg == dbapi_msg
    assert rec.data_reads == 0
    assert [snapshot(s) for s in sessions] == before


#: item 9: batches whose released shape must not depend on the data
SHAPES_ACCEPTED = statements("adult_accept.sql", "accept", "shape")


@pytest.mark.parametrize("sql", SHAPES_ACCEPTED)
def test_released_shape_is_identical_on_neighbouring_tables(neighbours, sql):
    """Passing: the same batch released on each table (and on `emptied`, where whole declared
    groups have no row) has the same result sets: the same columns, the same group keys in
    the same order, the same row counts (Python API, strategy `identity`: the shape does not
    depend on the strategy), also as seen through the DB-API's description, rowcount and
    nextset (strategy `auto`) on two neighbours."""
    shapes = {name: via_python(conn.session, sql, epsilon=0.1, delta=1e-6,
                               strategy="identity").shape
              for name, conn in neighbours.items()}
    assert all(shapes.values()) and len(set(shapes.values())) == 1, shapes
    for name in ("full", "minus_one"):
        assert via_dbapi(neighbours[name], sql).shape == shapes["full"], name
