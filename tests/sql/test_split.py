"""Tokenizing piece by piece (:mod:`dpsql.sql.split`) gives exactly the tokens of one sqlglot
call — types, texts, comments, lines, columns and offsets — and the same errors, wherever
the cuts fall (inside strings, quoted names, comments, dollar quotes, after CRLF)."""

from __future__ import annotations

import random

import pytest
import sqlglot

from dpsql.sql import split

FRAGMENTS = [
    "SELECT 1", "SELECT 'a;\nb'", 'SELECT "x;\ny" FROM t', "/* c;\n d */ SELECT 2",
    "-- x;\nSELECT 3", "SELECT 4 -- tail", "SELECT $$a;\n$$", "SELECT E'\\';\n'", "BEGIN",
    "COMMIT", "SELECT 5 /* t */", "select\n  6\n", "SELECT 7; -- after", "SELECT 'x'';\n'",
    "\r\nSELECT 8\r\n", "SET x = 1", "SELECT /*+ hint */ 9",
]
SEPARATORS = [";\n", "; \n", ";\r\n", ";", "; ", ";\t\n", ";\n\n", " ;\n"]
BROKEN = ["SELECT 'open", "SELECT /* open", 'SELECT "open']


def _key(tok) -> tuple:
    return (tok.token_type, tok.text, tok.line, tok.col, tok.start, tok.end,
            tuple(tok.comments))


def _tokens(read, text: str):
    try:
        return [_key(t) for t in read(text)]
    except sqlglot.errors.TokenError as exc:
        return ("error", str(exc))


def _text(rng: random.Random, broken: bool) -> str:
    parts = [rng.choice(FRAGMENTS) + rng.choice(SEPARATORS) for _ in range(rng.randint(1, 30))]
    if broken:
        parts.insert(rng.randrange(len(parts) + 1), rng.choice(BROKEN) + ";\n")
    return "".join(parts)


@pytest.mark.parametrize("seed", range(4))
def test_pieces_give_one_calls_tokens_and_errors(seed):
    rng = random.Random(seed)
    whole = sqlglot.Dialect.get_or_raise("duckdb").tokenize
    for _ in range(300):
        text = _text(rng, broken=rng.random() < 0.2)
        chars = rng.choice([1, 7, 40, 200, split.PIECE_CHARS])
        assert _tokens(lambda t: split.tokens(t, chars), text) == _tokens(whole, text), \
            (text, chars)


def test_a_long_text_is_read_in_pieces(monkeypatch):
    text = "".join(f"SELECT COUNT(*) FROM t WHERE x = {i};\n" for i in range(2000))
    sizes = []
    real = split._tokenize
    monkeypatch.setattr(split, "_tokenize", lambda t: sizes.append(len(t)) or real(t))
    tokens = split.tokens(text, chars=1000)
    assert len(sizes) > 50 and max(sizes) < 1100
    assert [_key(t) for t in tokens] == [_key(t) for t in sqlglot.Dialect.get_or_raise(
        "duckdb").tokenize(text)]


def test_cuts_inside_a_long_string_fall_back_to_one_call(monkeypatch):
    """A string literal holding many ``;`` line ends: a few failed cuts, then the rest in
    one call (never one attempt per line)."""
    text = "SELECT 1;\nSELECT '" + "x;\n" * 5000 + "';\nSELECT 2;\n"
    calls = []
    real = split._tokenize
    monkeypatch.setattr(split, "_tokenize", lambda t: calls.append(len(t)) or real(t))
    assert [_key(t) for t in split.tokens(text, chars=10)] == [
        _key(t) for t in sqlglot.Dialect.get_or_raise("duckdb").tokenize(text)]
    assert len(calls) <= split.MAX_RETRIES + 3
