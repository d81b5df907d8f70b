"""The batch reader's GC pause (:mod:`dpsql.sql.gcpause`): the collector's state is given
back as it was found, nested and concurrent readers share one pause, and garbage cycles
made during it are still freed by the young collections."""

from __future__ import annotations

import gc
import weakref

import pytest

from dpsql.sql import gcpause


@pytest.fixture
def collector():
    was = gc.isenabled()
    yield
    (gc.enable if was else gc.disable)()


@pytest.mark.parametrize("enabled", [True, False])
def test_the_collector_is_given_back_as_found(collector, enabled):
    (gc.enable if enabled else gc.disable)()
    with gcpause.young_only():
        assert not gc.isenabled()
        with gcpause.young_only():
            assert not gc.isenabled()
        assert not gc.isenabled()          # the outer reader still holds it
    assert gc.isenabled() == enabled


def test_an_error_gives_the_collector_back(collector):
    gc.enable()
    with pytest.raises(ZeroDivisionError):
        with gcpause.young_only():
            1 / 0
    assert gc.isenabled()


class _Node:
    pass


def test_cycles_made_during_the_pause_are_freed_by_ticks(collector):
    gc.enable()
    refs = []
    with gcpause.young_only():
        for _ in range(3 * gcpause.EVERY):
            a, b = _Node(), _Node()
            a.other, b.other = b, a           # a reference cycle, as sqlglot's trees hold
            refs.append(weakref.ref(a))
            del a, b
            gcpause.tick()
        alive = sum(r() is not None for r in refs)
    assert alive <= gcpause.EVERY              # only those since the last young collection
