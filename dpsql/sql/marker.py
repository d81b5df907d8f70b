"""THE workload marker: ``BEGIN WORKLOAD; ... COMMIT;`` collects statements into one workload.

Recognised here and only here; every interface (the shell, scripts, the DB-API and the
server that routes through it) walks its statements with :func:`walk` and a
:class:`WorkloadBlock`, so a block means the same everywhere:

- ``BEGIN WORKLOAD`` opens a block; the queries after it are collected, not released;
- ``COMMIT`` (also ``END``, ``END WORKLOAD``) releases the collected queries as ONE
  workload (one charge, one noise draw, one ledger entry);
- ``ROLLBACK`` (also ``ABORT``) discards them: nothing is charged;
- plain ``BEGIN`` / ``START TRANSACTION``, and ``COMMIT`` / ``ROLLBACK`` with no block open,
  are harmless no-ops with a notice (clients such as psql and ORMs send them);
- ``BEGIN WORKLOAD`` inside an open block is refused (:class:`WorkloadBlockError`): blocks
  do not nest.

Pure: no database. Markers are read from sqlglot's tokens (comments and case do not count).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Sequence

import sqlglot
from sqlglot.tokens import TokenType

from dpsql.errors import WorkloadBlockError
from dpsql.sql import split

BEGIN_WORKLOAD, COMMIT, ROLLBACK, BEGIN = "begin workload", "commit", "rollback", "begin"

#: token words (upper case) -> the marker they spell
_FORMS = {
    ("BEGIN", "WORKLOAD"): BEGIN_WORKLOAD,
    ("COMMIT",): COMMIT, ("COMMIT", "WORK"): COMMIT, ("COMMIT", "TRANSACTION"): COMMIT,
    ("END",): COMMIT, ("END", "WORKLOAD"): COMMIT,
    ("END", "WORK"): COMMIT, ("END", "TRANSACTION"): COMMIT,
    ("ROLLBACK",): ROLLBACK, ("ROLLBACK", "WORK"): ROLLBACK,
    ("ROLLBACK", "TRANSACTION"): ROLLBACK,
    ("ABORT",): ROLLBACK,
    ("BEGIN",): BEGIN, ("BEGIN", "WORK"): BEGIN, ("BEGIN", "TRANSACTION"): BEGIN,
    ("START", "TRANSACTION"): BEGIN,
}

HOW = "BEGIN WORKLOAD; ... COMMIT;"

NOTICE_PLAIN_BEGIN = (f"BEGIN alone does not batch (dpsql has no transactions): each query "
                      f"is still released on its own; write {HOW} to answer several queries "
                      "as one workload")
NOTICE_NO_BLOCK = {COMMIT: "COMMIT with no workload block open: nothing to release",
                   ROLLBACK: "ROLLBACK with no workload block open: nothing to discard "
                             "(releases are charged when answered and cannot be undone)"}
NOTICE_EMPTY = "COMMIT of an empty workload block: nothing released, nothing charged"


def notice_discarded(count: int) -> str:
    return (f"workload block discarded ({count} statement{'s' if count != 1 else ''} "
            "collected); nothing was charged")


@dataclass(frozen=True)
class Piece:
    """One statement of a text: its text (without the ``;``), its marker (or None for a
    query or anything else) and where it starts."""

    text: str
    marker: str | None
    line: int = 1
    column: int = 1


#: what may follow BEGIN [WORK | TRANSACTION] / START TRANSACTION: PostgreSQL's transaction
#: modes (``BEGIN ISOLATION LEVEL SERIALIZABLE``, ``START TRANSACTION READ ONLY``), which
#: drivers send; such a statement is a plain BEGIN
_MODES = {"ISOLATION", "READ", "DEFERRABLE", "NOT"}


def marker_of(words: Sequence[str]) -> str | None:
    """The marker spelled by a statement's words (upper or lower case), or None."""
    upper = tuple(w.upper() for w in words)
    if len(upper) > 2 and _FORMS.get(upper[:2]) == BEGIN and upper[2] in _MODES:
        return BEGIN
    if len(upper) > 1 and upper[0] == "BEGIN" and upper[1] in _MODES:
        return BEGIN
    return _FORMS.get(upper)


def pieces(text: str) -> list[Piece]:
    """The statements of ``text`` with their markers. A text sqlglot cannot even tokenize
    is one piece (no marker): the ordinary path reports its error."""
    try:
        tokens = split.tokens(text)       # sqlglot's tokens, piece by piece
    except sqlglot.errors.TokenError:
        return [Piece(text.strip().rstrip(";"), None)] if text.strip() else []
    out, current = [], []
    for tok in [*tokens, None]:
        if tok is not None and tok.token_type != TokenType.SEMICOLON:
            current.append(tok)
            continue
        if current:
            first, last = current[0], current[-1]
            out.append(Piece(text[first.start:last.end + 1],
                             marker_of([t.text for t in current]),
                             first.line, first.col - len(first.text) + 1))
        current = []
    return out


#: the words a marker starts with, upper case
_FIRST_WORDS = frozenset(words[0] for words in _FORMS)


def has_marker(text: str) -> bool:
    """Whether ``text`` holds a workload marker. A text in which none of the words a marker
    starts with appears (in any case; a token's text is part of the text) has none, and is
    not tokenized here: the parse that follows reads it once."""
    upper = text.upper()
    if not any(word in upper for word in _FIRST_WORDS):
        return False
    return any(p.marker for p in pieces(text))


@dataclass
class WorkloadBlock:
    """The statements collected since ``BEGIN WORKLOAD`` (one per connection, shell or
    script walk). ``opened``: where it was opened, for messages. ``policies``: the protected
    tables' policies as first read for this block (``Session.check(sql, block=…)``), against
    which each statement collected is checked without reopening the database each time; the
    release at ``COMMIT`` reads them afresh."""

    statements: list = field(default_factory=list)
    is_open: bool = False
    opened: str = ""
    policies: dict | None = None

    def begin(self, line: int | None = None, column: int | None = None) -> None:
        """Open the block; refused when one is open already (it stays open as it was)."""
        if self.is_open:
            raise WorkloadBlockError(
                f"BEGIN WORKLOAD: a workload block is already open{self.opened} with "
                f"{self.describe()}; blocks do not nest: COMMIT; to release it or "
                "ROLLBACK; to discard it first", line, column)
        self.is_open, self.statements, self.policies = True, [], None
        self.opened = f" (since line {line})" if line is not None else ""

    def add(self, *texts: str) -> None:
        self.statements.extend(texts)

    def close(self) -> list:
        """Close the block; its statements (to release or to discard)."""
        done, self.statements, self.is_open, self.opened = self.statements, [], False, ""
        self.policies = None
        return done

    def describe(self) -> str:
        n = len(self.statements)
        return f"{n} statement{'s' if n != 1 else ''} collected"


@dataclass(frozen=True)
class Step:
    """What an interface does next while walking a text:

    - ``answer``: queries outside any block (consecutive ones together), released as today;
    - ``collect``: one query inside the open block; the interface checks it (explain) and
      then calls ``block.add(step.text)``;
    - ``release``: the block was committed: ``step.statements`` are ONE workload;
    - ``notice``: a no-op marker, a discarded block or an empty commit; ``step.text`` says so.
    """

    kind: str
    text: str = ""
    statements: tuple = ()
    piece: Piece | None = None


def walk(items: str | Sequence[str], block: WorkloadBlock) -> Iterator[Step]:
    """Walk a text (or a list of single statements) through ``block``. A generator: the
    block changes as the steps are consumed, so an interface may check each collected
    statement before the next step. ``BEGIN WORKLOAD`` inside an open block raises
    :class:`WorkloadBlockError` (the block stays open as it was)."""
    texts = [items] if isinstance(items, str) else list(items)
    outside: list[Piece] = []
    for text in texts:
        for piece in pieces(text):
            if piece.marker is None and not block.is_open:
                outside.append(piece)
                continue
            if outside:
                yield Step("answer", ";\n".join(p.text for p in outside) + ";")
                outside = []
            yield from _marker_step(piece, block)
    if outside:
        yield Step("answer", ";\n".join(p.text for p in outside) + ";")


def _marker_step(piece: Piece, block: WorkloadBlock) -> Iterator[Step]:
    if piece.marker is None:
        yield Step("collect", piece.text + ";", piece=piece)
    elif piece.marker == BEGIN_WORKLOAD:
        block.begin()
    elif piece.marker == BEGIN:
        yield Step("notice", NOTICE_PLAIN_BEGIN + (
            f" (a workload block is open with {block.describe()})" if block.is_open else ""))
    elif not block.is_open:
        yield Step("notice", NOTICE_NO_BLOCK[piece.marker])
    elif piece.marker == ROLLBACK:
        yield Step("notice", notice_discarded(len(block.close())))
    else:
        statements = tuple(block.close())
        yield (Step("release", statements=statements) if statements
               else Step("notice", NOTICE_EMPTY))
