"""Tokenize a long text piece by piece: the same tokens as one call, but cancellable.

sqlglot's tokenizer reads a whole text in one call, so a request's cancel token
(:mod:`dpsql.cancel`) would wait for a 25,000-statement text to be read (issue 22). Here the
text is cut into *pieces* of about :data:`PIECE_CHARS` characters, each ending at a
statement's ``;`` followed by nothing but spaces and a line break; each piece is tokenized by
sqlglot's own DuckDB tokenizer (the lexing stays sqlglot's, never a regex) and the token is
checked between pieces.

That gives exactly the tokens of one call, positions included (each piece's line and
character offsets are added to its tokens):

- a piece starts at the start of a line, after a ``;`` that ended the previous piece, which is
  how sqlglot's tokenizer starts a text too (no pending comment, a command keyword is
  recognised as after a ``;``, columns count from the line's start);
- the tokenizer reads left to right, so a piece's tokens are the text's unless the cut falls
  inside a token (a string, a quoted name, a comment): then the piece fails to tokenize or
  does not end with that ``;`` token, and the cut is dropped (the piece grows to the next
  cut; after :data:`MAX_RETRIES` failures the rest of the text is read in one call);
- a comment after the ``;`` on its line would belong to the ``;``: such a ``;`` is no cut.

A text that sqlglot cannot tokenize is tokenized whole once more, so its error is the one
a single call gives (positions and all). Public inputs only.
"""

from __future__ import annotations

import threading
from typing import Iterator

import sqlglot
from sqlglot.dialects.dialect import Dialect
from sqlglot.tokens import TokenType

from dpsql import cancel
from dpsql.sql import gcpause

#: characters per piece: sqlglot's compiled tokenizer reads about 3 MB/s on the project's
#: machine (pure Python about a third of that), so a piece takes a few milliseconds
PIECE_CHARS = 16_384
#: failed cuts in a row (inside strings or comments) before the rest is read in one call
MAX_RETRIES = 4


_DIALECT: list = []
_LOCAL = threading.local()


def dialect() -> Dialect:
    """sqlglot's DuckDB dialect, made once (``get_or_raise`` makes a new one each call)."""
    if not _DIALECT:
        _DIALECT.append(Dialect.get_or_raise("duckdb"))
    return _DIALECT[0]


def _tokenize(text: str) -> list:
    """sqlglot's DuckDB tokens of ``text``, by this thread's tokenizer (sqlglot resets it
    for each text; making one per statement costs as much as reading a short statement)."""
    tokenizer = getattr(_LOCAL, "tokenizer", None)
    if tokenizer is None:
        tokenizer = _LOCAL.tokenizer = dialect().tokenizer()
    return tokenizer.tokenize(text)


def cut(text: str, at: int) -> int:
    """The end of the first piece-ending line at or after ``at``: the index after the line
    break that follows a ``;`` and spaces; ``len(text)`` if there is none."""
    size = len(text)
    while at < size:
        semi = text.find(";", at)
        if semi < 0:
            return size
        k = semi + 1
        while k < size and text[k] in " \t":
            k += 1
        if text.startswith("\r\n", k):
            return k + 2
        if k < size and text[k] == "\n":
            return k + 1
        at = k
    return size


def pieces(text: str, chars: int = PIECE_CHARS) -> Iterator[list]:
    """Yield the tokens of ``text``, piece by piece (see the module's doc), with their
    positions in ``text``; the cancel token is checked before each piece. Tokenizer errors
    are raised as one call over ``text`` raises them."""
    start, lines, size = 0, 0, len(text)
    while start < size:
        cancel.check()
        end, tokens = _piece(text, start, chars)
        if not tokens:
            return
        if lines or start:
            for tok in tokens:
                tok.line += lines
                tok.start += start
                tok.end += start
        gcpause.tick(len(tokens) // 20)    # about a statement's worth of tokens
        yield tokens
        lines = tokens[-1].line            # the ``;``'s line; the next piece starts below it
        start = end


def _piece(text: str, start: int, chars: int) -> tuple[int, list]:
    """(end, tokens) of the piece starting at ``start`` (tokens relative to it)."""
    size = len(text)
    end = cut(text, start + chars)
    for attempt in range(MAX_RETRIES + 1):
        if attempt == MAX_RETRIES:
            end = size
        piece = text[start:end]
        try:
            tokens = _tokenize(piece)
        except sqlglot.errors.TokenError:
            if end == size:
                if start:
                    _tokenize(text)          # the error as one call gives it
                raise
            tokens = None
        if end == size or tokens and _ends_at_cut(tokens, piece):
            return end, tokens or []
        end = cut(text, end)
    raise AssertionError("unreachable")


def _ends_at_cut(tokens: list, piece: str) -> bool:
    """The piece's last token is the ``;`` its cut follows (so no token spans the cut)."""
    last = tokens[-1]
    return last.token_type == TokenType.SEMICOLON and last.end == piece.rindex(";") \
        and not last.comments


def tokens(text: str, chars: int = PIECE_CHARS) -> list:
    """All of ``text``'s tokens, read piece by piece (:func:`pieces`)."""
    out: list = []
    for part in pieces(text, chars):
        out.extend(part)
    return out
