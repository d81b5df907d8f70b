"""A cancel during the parse of one huge multi-statement text (issue 22's leftover): the text
is tokenized piece by piece (:mod:`dpsql.sql.split`) and the request's token is checked
between pieces, so a cancel from another thread lands after at most the piece being read,
long before the text's 25,000 statements are read. Progress is counted in pieces and
statements read, not in seconds."""

from __future__ import annotations

import threading

import pytest

from dpsql import cancel
from dpsql.errors import RequestCancelled
from dpsql.policy.policy import table_policy_from_spec
from dpsql.sql import parse, split

POLICY = table_policy_from_spec("t", {"epsilon": 1, "delta": 1e-6, "columns": {
    "x": {"type": "integer", "min": 0, "max": 99},
    "c": {"type": "categorical", "values": ["a", "b"]}}})
STATEMENTS = 25_000


def _big_text(statements: int = STATEMENTS) -> str:
    return "".join(f"SELECT c, COUNT(*) FROM t WHERE x BETWEEN {i % 100} AND {i % 100 + 5} "
                   f"GROUP BY c;\n" for i in range(statements))


def test_a_cancel_lands_while_a_huge_text_is_tokenized(monkeypatch):
    text = _big_text()
    token = cancel.Token()
    started, cancelled = threading.Event(), threading.Event()
    read = {"pieces": 0, "statements": 0}
    statements_parsed = []
    real_tokenize, real_statement = split._tokenize, parse._statement

    def tokenize(piece):
        tokens = real_tokenize(piece)
        read["pieces"] += 1
        read["statements"] += piece.count(";")
        if read["pieces"] == 2:          # the parse is under way: let the other thread cancel
            started.set()
            assert cancelled.wait(60)
        return tokens

    def statement(*args):
        statements_parsed.append(args[0])
        return real_statement(*args)

    def canceller():
        assert started.wait(60)
        token.cancel("stopped by the test")
        cancelled.set()

    monkeypatch.setattr(split, "_tokenize", tokenize)
    monkeypatch.setattr(parse, "_statement", statement)
    thread = threading.Thread(target=canceller)
    thread.start()
    with pytest.raises(RequestCancelled, match="stopped by the test"):
        with cancel.scope(token):
            parse.parse_batch(text, lambda name, node: POLICY)
    thread.join()
    total_pieces = len(text) // split.PIECE_CHARS
    assert total_pieces > 50
    assert read["pieces"] == 2              # the piece being read when it came, no more
    assert read["statements"] < STATEMENTS // 20    # two pieces of about 250 statements
    assert statements_parsed == []


def test_a_cancel_lands_between_statements_after_tokenizing(monkeypatch):
    """Once the text is tokenized, each statement's parse is followed by a check."""
    text = _big_text(3_000)
    token = cancel.Token()
    parsed = []
    real_statement = parse._statement

    def statement(*args):
        parsed.append(args[0])
        if len(parsed) == 100:
            token.cancel()
        return real_statement(*args)

    monkeypatch.setattr(parse, "_statement", statement)
    with pytest.raises(RequestCancelled):
        with cancel.scope(token):
            parse.parse_batch(text, lambda name, node: POLICY)
    assert len(parsed) == 100


def test_without_a_cancel_a_long_text_parses_whole():
    queries = parse.parse_batch(_big_text(3_000), lambda name, node: POLICY)
    assert len(queries) == 3_000
    assert queries[-1].index == 2_999 and queries[-1].sql.endswith("GROUP BY c")
