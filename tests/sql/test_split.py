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
    # one-line adversaries: a ``;`` then a space inside every kind of token
    "SELECT 'a; b'", "SELECT 'a;b'", 'SELECT "x; y" FROM t', "SELECT 1 /* ; c */",
    "/* c; d */ SELECT 2", "SELECT 3 -- ; tail", "SELECT $$a; b$$", "SELECT $q$ ; $q$",
    "SELECT $x", "SELECT $1", "SELECT a$b", "SELECT E'\\'; '", "SELECT 'x''; '",
    "SELECT ';'", "SELECT 1 /* a */ /* b; */", "SELECT 10\rSELECT", "SHOW t; x",
]
SEPARATORS = [";\n", "; \n", ";\r\n", ";", "; ", ";\t\n", ";\n\n", " ;\n", ";  ",
              ";\t", "; /* after; */ ", "; -- after;\n", ";\r", ";;", "; ;"]
BROKEN = ["SELECT 'open", "SELECT /* open", 'SELECT "open']


#: a ``$`` parameter (``$x``, ``$1``): sqlglot looks ahead for a dollar quote's closing tag,
#: counting the lines it passes, and does not take them back when there is none, so one call
#: gives the tokens after it lines past the text's end (``SELECT $x;\nSELECT 1;`` puts the
#: ``;`` on line 3, column -3); pieces look ahead only to their own end. Such texts are
#: compared by type, text, offsets and comments only.
PARAMETERS = ("$x", "$1")


def _key(tok, positions: bool = True) -> tuple:
    return (tok.token_type, tok.text, tok.start, tok.end, tuple(tok.comments)) + (
        (tok.line, tok.col) if positions else ())


def _tokens(read, text: str):
    positions = not any(p in text for p in PARAMETERS)
    try:
        return [_key(t, positions) for t in read(text)]
    except sqlglot.errors.TokenError as exc:
        return ("error", str(exc))


def _text(rng: random.Random, broken: bool) -> str:
    parts = [rng.choice(FRAGMENTS) + rng.choice(SEPARATORS) for _ in range(rng.randint(1, 30))]
    if broken:
        parts.insert(rng.randrange(len(parts) + 1), rng.choice(BROKEN) + ";\n")
    return "".join(parts)


@pytest.mark.parametrize("seed", range(8))
def test_pieces_give_one_calls_tokens_and_errors(seed):
    rng = random.Random(seed)
    whole = sqlglot.Dialect.get_or_raise("duckdb").tokenize
    for _ in range(300):
        text = _text(rng, broken=rng.random() < 0.2)
        if seed % 2:                         # one line: every cut falls mid-line
            text = text.replace("\r\n", " ").replace("\n", " ")
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
