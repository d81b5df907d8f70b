"""Tokenize a long text piece by piece: the same tokens as one call, but cancellable.

sqlglot's tokenizer reads a whole text in one call, so a request's cancel token
(:mod:`dpsql.cancel`) would wait for a 25,000-statement text to be read (issue 22). Here the
text is cut into *pieces* of about :data:`PIECE_CHARS` characters, each ending just after a
statement's ``;`` and the spaces that follow it: at a line break, or mid-line before the next
statement (a text written on one line is cut too); each piece is tokenized by sqlglot's own
DuckDB tokenizer (the lexing stays sqlglot's, never a regex) and the token is checked
between pieces.

That gives exactly the tokens of one call, positions included (each piece's line, column
and character offsets are added to its tokens; a mid-line piece's first line continues the
``;``'s line):

- a piece starts after a ``;`` that ended the previous piece, which is how sqlglot's
  tokenizer starts a text too (no pending comment, a command keyword is recognised as after
  a ``;``);
- the tokenizer reads left to right, so a piece's tokens are the text's unless the cut falls
  inside a token (a string, a quoted name, a comment, a dollar quote): then the piece fails
  to tokenize or does not end with that ``;`` token, and the cut is dropped (the piece grows
  to the next cut; after :data:`MAX_RETRIES` failures the rest of the text is read in one
  call);
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
_COMMENTS: list = []
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


def _comment_starts() -> tuple:
    """How a comment starts in the dialect (``--``, ``/*``), read once."""
    if not _COMMENTS:
        _COMMENTS.extend(c if isinstance(c, str) else c[0]
                         for c in dialect().tokenizer_class.COMMENTS)
    return tuple(_COMMENTS)


def cut(text: str, at: int) -> int:
    """The end of the first cut at or after ``at``: after a ``;`` and the spaces or tabs
    that follow it, and after the line break that follows them, if one does; never before a
    comment on the ``;``'s line (it belongs to the ``;``) nor before a lone carriage return.
    ``len(text)`` if there is none."""
    size, comments = len(text), _comment_starts()
    while at < size:
        semi = text.find(";", at)
        if semi < 0:
            return size
        k = semi + 1
        while k < size and text[k] in " \t":
            k += 1
        if text.startswith("\r\n", k):
            return k + 2
        if text.startswith("\n", k):
            return k + 1
        if not text.startswith(comments, k) and not text.startswith("\r", k):
            return k           # mid-line, before the next statement (or at the text's end)
        at = k                 # (a lone CR: sqlglot counts it as a line for some purposes only)
    return size


def pieces(text: str, chars: int = PIECE_CHARS) -> Iterator[list]:
    """Yield the tokens of ``text``, piece by piece (see the module's doc), with their
    positions in ``text``; the cancel token is checked before each piece. Tokenizer errors
    are raised as one call over ``text`` raises them."""
    start, size = 0, len(text)
    lines, columns = 0, 0      # lines before the piece's first; columns before it on that line
    while start < size:
        cancel.check()
        end, tokens = _piece(text, start, chars)
        if not tokens:
            return
        if start:
            for tok in tokens:
                if tok.line == 1:
                    tok.col += columns
                tok.line += lines
                tok.start += start
                tok.end += start
        semi = tokens[-1]          # the ``;`` the cut follows (or the text's last token)
        if text[end - 1] == "\n":
            lines, columns = semi.line, 0
        else:                      # a mid-line cut: the next piece continues the ``;``'s line
            lines, columns = semi.line - 1, semi.col + (end - 1 - semi.end)
        gcpause.tick(len(tokens) // 20)    # about a statement's worth of tokens
        yield tokens
        start = end


def one_piece(text: str) -> list:
    """:func:`tokens` of a text of at most :data:`PIECE_CHARS` characters (one piece: read
    in one call, as :func:`pieces` reads it), checking the cancel token first."""
    cancel.check()
    tokens = _tokenize(text)
    gcpause.tick(len(tokens) // 20)
    return tokens


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
