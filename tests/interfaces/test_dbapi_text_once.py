"""The DB-API reads a submission's text once where it can, and a cancel lands while it does
(issue 22 item 2): a text without placeholders is not parsed to bind it, a text without a
marker word is not tokenized to look for markers, the result-table check parses each
statement once, and ``Connection.cancel()`` stops an execute still reading its text (before
its request starts), nothing charged. Progress is counted in statements, never seconds."""

from __future__ import annotations

import pytest

from dpsql.interfaces import dbapi, dbapi_binding
from dpsql.sql import marker, split
from dpsql.store import readback

STATEMENTS = [f"SELECT COUNT(*) FROM adult WHERE age BETWEEN {a} AND {a + 3}"
              for a in range(20, 60)]
ONE_LINE = "; ".join(STATEMENTS) + ";"


def _counting(monkeypatch, module, name) -> list:
    calls: list = []
    real = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a, **k: calls.append(a) or real(*a, **k))
    return calls


def test_a_text_without_placeholders_or_markers_is_read_once(conn, monkeypatch):
    parses = _counting(monkeypatch, dbapi_binding, "split_statements")
    assert dbapi_binding._Template(ONE_LINE).bind(None) == ONE_LINE
    assert dbapi_binding._Template("SELECT 1 WHERE a = ?").bind([3]) == ["SELECT 1 WHERE a = 3"]
    assert len(parses) == 2            # the placeholder text: parsed, and its bound text checked
    pieces = _counting(monkeypatch, split, "pieces")
    assert not marker.has_marker(ONE_LINE) and not pieces
    assert marker.has_marker("select 1; commit;") and pieces
    assert not marker.has_marker("SELECT 'commit'; SELECT 2")


def test_result_table_check_parses_each_statement_once(conn, monkeypatch):
    trees = _counting(monkeypatch, readback, "tree_of")
    conn.cursor().execute(ONE_LINE)
    assert len(trees) == len(STATEMENTS)


def test_a_cancel_lands_while_the_execute_reads_its_text(conn, monkeypatch):
    """``Connection.cancel()`` (another thread's call, made here from inside the result-table
    check on its fifth statement) stops the execute before its request: nothing charged."""
    trees = []
    real = readback.tree_of

    def tree_of(sql):
        trees.append(sql)
        if len(trees) == 5:
            conn.cancel()
        return real(sql)

    monkeypatch.setattr(readback, "tree_of", tree_of)
    before = conn.session.ledger()
    with pytest.raises(dbapi.OperationalError, match="cancelled by Connection.cancel"):
        conn.cursor().execute(ONE_LINE)
    assert len(trees) <= 6
    assert conn.session.ledger() == before
    monkeypatch.setattr(readback, "tree_of", real)
    assert conn.cursor().execute(ONE_LINE).fetchall()     # the next execute runs


def test_the_schema_probe_does_not_parse_a_batch(monkeypatch):
    """The probe check (``SELECT * FROM t LIMIT 0``) tokenizes a text of several statements
    in cancellable pieces and stops there: the batch is parsed once, by its request."""
    from dpsql.sql import probe

    parsed = []
    real = split.dialect().parser_class.parse
    monkeypatch.setattr(split.dialect().parser_class, "parse",
                        lambda self, tokens, sql=None: parsed.append(len(tokens))
                        or real(self, tokens, sql))
    assert probe.probe(ONE_LINE) is None and not parsed
    assert probe.probe("SELECT * FROM adult LIMIT 0; SELECT 1") is None and not parsed
    assert probe.probe("SELECT * FROM adult LIMIT 0;;") == probe.Probe("adult", None)
    assert probe.probe("select age from adult where 1 = 0") == probe.Probe("adult", ("age",))
    assert parsed                      # (the two single statements were)
