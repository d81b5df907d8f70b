"""Parse large batches without parsing the same statement shape twice (issue 16).

A batch of thousands of statements is usually a few *shapes* (``SELECT c, COUNT(*) FROM t
WHERE age BETWEEN ? AND ? GROUP BY c``) repeated with different constants. sqlglot's parser
costs about 0.6 ms per statement; its tokenizer about a fifth of that. So each text is
tokenized once (sqlglot's own DuckDB tokenizer: the lexing is sqlglot's, never a regex), cut
into statements at semicolons exactly as sqlglot's parser cuts them, and each statement's
*shape* — its token types, the text of every token that is not a literal, and the comments —
is looked up: the first statement of a shape is parsed by sqlglot, later ones are that tree
with their own literals and positions put in (:func:`statements`).

That is exact because sqlglot's parser reads a number or string literal as one token whose
text becomes a ``Literal`` node verbatim; it branches on token types and keyword texts, which
the shape holds. Where a literal's text could steer the parse (after a type keyword:
``DATE '…'``, ``INTERVAL '5 day'``) the statement is not templated: a literal is substituted
only after a comparison, ``BETWEEN``/``AND``, ``(``, ``,`` or a sign
(:data:`SAFE_BEFORE`). A template is built only when every literal token maps to exactly one
``Literal`` node holding its text, and every node's position (line, column, start, end) maps
to a token, so substituted trees carry their own statement's positions: refusals point at the
same place a full parse would. Anything else — a text with other kinds of statements
(``BEGIN``, ``SET``), a shape that does not map — is parsed by sqlglot whole, as before.
Public inputs only.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.tokens import TokenType

from dpsql.sql import split

#: token types after which a literal's text cannot steer sqlglot's parse
SAFE_BEFORE = frozenset({
    TokenType.EQ, TokenType.NEQ, TokenType.LT, TokenType.LTE, TokenType.GT, TokenType.GTE,
    TokenType.BETWEEN, TokenType.AND, TokenType.L_PAREN, TokenType.COMMA, TokenType.DASH,
    TokenType.PLUS})
#: the literal tokens a template substitutes
LITERALS = frozenset({TokenType.NUMBER, TokenType.STRING})
#: statements of a templated text start with one of these (the allow-list's two forms)
STARTS = frozenset({TokenType.SELECT, TokenType.CREATE})
_FIELDS = ("line", "col", "start", "end")


@dataclass(frozen=True)
class Template:
    """A parsed statement, where its literals sit, and where each node's position comes
    from: ``positions[k] = (node index in walk order, {field: token index})``."""

    tree: exp.Expression
    literals: tuple            # (node index, token index) per literal token
    positions: tuple
    nodes: tuple               # the tree's nodes in walk order
    #: DuckDB text around the literals: ``text[0] + lit + text[1] + …`` (literals in text
    #: order, ``order`` their indices in :attr:`literals`), or None: generate the text
    text: tuple | None = None
    order: tuple = ()


def dialect() -> Dialect:
    return split.dialect()


def chunks(tokens: list) -> list[list]:
    """The statements' tokens, cut at semicolons as sqlglot's parser cuts them (a
    semicolon's own comments, which sqlglot keeps as an empty statement, are dropped, as
    :func:`dpsql.sql.parse.split_statements` drops that statement)."""
    out, current = [], []
    for tok in tokens:
        if tok.token_type == TokenType.SEMICOLON:
            if current:
                out.append(current)
            current = []
        else:
            current.append(tok)
    if current:
        out.append(current)
    return out


def shape(chunk: list) -> tuple | None:
    """The statement's shape (None: it has a literal a template may not substitute)."""
    key = []
    previous = None
    for tok in chunk:
        if tok.token_type in LITERALS:
            if previous not in SAFE_BEFORE:
                return None
            key.append((tok.token_type, None, tuple(tok.comments)))
        else:
            key.append((tok.token_type, tok.text, tuple(tok.comments)))
        previous = tok.token_type
    return tuple(key)


def template(tree: exp.Expression, chunk: list) -> Template | None:
    """Where ``tree``'s literals and positions come from in ``chunk`` (None: they do not
    all map, so the shape is parsed statement by statement)."""
    by_field = {f: {} for f in _FIELDS}
    for k, tok in enumerate(chunk):
        for f, value in (("line", (tok.line, tok.col)), ("col", (tok.line, tok.col)),
                         ("start", tok.start), ("end", tok.end)):
            by_field[f].setdefault(value, k)
    nodes = list(tree.walk())
    positions, claimed = [], {}
    for j, node in enumerate(nodes):
        meta = node._meta
        if not meta or not any(f in meta for f in _FIELDS):
            continue
        if "line" in meta and "col" not in meta or "col" in meta and "line" not in meta:
            return None
        where = {}
        for f in _FIELDS:
            if f in meta:
                value = (meta["line"], meta["col"]) if f in ("line", "col") else meta[f]
                if value not in by_field[f]:
                    return None
                where[f] = by_field[f][value]
        positions.append((j, where))
        if isinstance(node, exp.Literal) and "end" in where:
            claimed.setdefault(where["end"], []).append(j)
    literals = []
    for k, tok in enumerate(chunk):
        if tok.token_type not in LITERALS:
            continue
        owners = claimed.get(k, [])
        if len(owners) != 1:
            return None
        node = nodes[owners[0]]
        if node.this != tok.text or node.is_string != (tok.token_type == TokenType.STRING):
            return None
        literals.append((owners[0], k))
    text, order = _text_template(tree, nodes, literals)
    return Template(tree, tuple(literals), tuple(positions), tuple(nodes), text, order)


def _text_template(tree, nodes, literals) -> tuple:
    """The generated DuckDB text cut around each literal: each literal is set to a sentinel
    that cannot occur in SQL, the tree generated once, and each sentinel's rendering must
    occur exactly once (literal rendering is context-free in sqlglot's generator:
    ``Generator.literal_sql``), else (None, ())."""
    saved = [nodes[j].this for j, _ in literals]
    try:
        for k, (j, _) in enumerate(literals):
            nodes[j].args["this"] = f"\x00{k}\x00"
        full = tree.sql(dialect="duckdb")
        found = []
        for k, (j, _) in enumerate(literals):
            rendered = _render(nodes[j])
            if full.count(rendered) != 1:
                return None, ()
            found.append((full.index(rendered), len(rendered), k))
    finally:
        for (j, _), value in zip(literals, saved):
            nodes[j].args["this"] = value
    found.sort()
    text, at = [], 0
    for where, length, _ in found:
        text.append(full[at:where])
        at = where + length
    text.append(full[at:])
    return tuple(text), tuple(k for _, _, k in found)


_GENERATOR = []


def _render(literal: exp.Literal) -> str:
    """One literal as sqlglot's DuckDB generator writes it."""
    if not _GENERATOR:
        _GENERATOR.append(dialect().generator())
    return _GENERATOR[0].literal_sql(literal)


def text(t: Template) -> str | None:
    """The DuckDB text of the template's last instantiation, without generating it."""
    if t.text is None:
        return None
    lits = [t.nodes[t.literals[k][0]] for k in t.order]
    return "".join(part + _render(lit) for part, lit in zip(t.text, lits)) + t.text[-1]


#: literal renderings by (text, is a string), a pure function of the two (:func:`_render`):
#: at most this many, of literals of at most :data:`_RENDERED_CHARS` characters
_RENDERED: dict = {}
_RENDERED_MAX = 1 << 14
_RENDERED_CHARS = 64


def chunk_text(t: Template, chunk: list) -> str:
    """The DuckDB text :func:`instantiate` of ``chunk`` would give (:func:`text`), without
    instantiating: each literal token rendered as its node would be (a ``Literal`` holding
    the token's text; renderings remembered). ``t.text`` must not be None."""
    out = []
    for part, k in zip(t.text, t.order):
        j, tok = t.literals[k]
        key = (chunk[tok].text, t.nodes[j].is_string)
        rendered = _RENDERED.get(key)
        if rendered is None:
            rendered = _render_text(*key)
        out.append(part)
        out.append(rendered)
    out.append(t.text[-1])
    return "".join(out)


def _render_text(text: str, is_string: bool) -> str:
    rendered = _render(exp.Literal(this=text, is_string=is_string))   # a node per thread
    if len(text) <= _RENDERED_CHARS:
        if len(_RENDERED) >= _RENDERED_MAX:
            _RENDERED.clear()
        _RENDERED[(text, is_string)] = rendered
    return rendered


def instantiate(t: Template, chunk: list, copy: bool = True) -> exp.Expression:
    """The template's tree with ``chunk``'s literals and positions: a new tree, or (``copy``
    False) the template's own, rewritten in place — valid until the next instantiation,
    for a caller that reads each statement before asking for the next (half the cost)."""
    tree = t.tree.copy() if copy else t.tree
    nodes = t.nodes if not copy else list(tree.walk())
    for j, where in t.positions:
        meta = nodes[j].meta
        for f, k in where.items():
            tok = chunk[k]
            meta[f] = tok.line if f == "line" else tok.col if f == "col" else \
                tok.start if f == "start" else tok.end
    for j, k in t.literals:
        nodes[j].args["this"] = chunk[k].text
    return tree


class TooManyStatements(Exception):
    """A text with more statements than the caller has room for (nothing was parsed)."""


def statement_tokens(text: str, room: int) -> list | None:
    """The tokens of each statement of ``text``, or None when one does not start with SELECT
    or CREATE (the caller parses the text whole). More than ``room`` statements raise
    :class:`TooManyStatements` before any is parsed; tokenizer errors propagate."""
    parts: list = []
    try:
        if len(text) <= split.PIECE_CHARS:
            # one piece, read whole as :func:`split.pieces` reads it (no generator per
            # statement); a text without ``;`` has no SEMICOLON token: one statement
            tokens = split.one_piece(text)
            parts = chunks(tokens) if ";" in text else [tokens] if tokens else []
        else:
            for piece in split.pieces(text):   # a cancel lands between pieces; a piece ends
                parts.extend(chunks(piece))    # at a ``;``, so no statement spans two
    except BaseException:
        parts.clear()    # a cancel: the tokens go now, not with the traceback that holds this
        raise            # frame (the collector, back on, would walk them first: gcpause)
    if len(parts) > room:
        raise TooManyStatements(len(parts))
    if any(chunk[0].token_type not in STARTS for chunk in parts):
        return None
    return parts


def statements(sql: str, parts: list, parse_chunk, cache: dict, copy: bool = True):
    """Yield ``(tree, its DuckDB text or None, its shape's Template or None, tokens)`` for
    the statements ``parts`` of ``sql``, each shape parsed once by ``parse_chunk(tokens,
    sql)`` (one tree); ``cache`` maps shapes to templates across the texts of one batch.
    ``copy`` True: every tree is a new one. ``copy`` False: a later statement of a shape
    comes as ``(None, None, template, tokens)``, for the caller to read from its tokens or
    to :func:`instantiate` in place (then its text is :func:`text`). A shape's first
    statement, parsed, comes with the template made from it: its tree has the template's
    structure, node for node."""
    for chunk in parts:
        key = shape(chunk)
        found = cache.get(key) if key is not None else None
        if found:
            yield (instantiate(found, chunk), None, found, chunk) if copy else \
                (None, None, found, chunk)
            continue
        tree = parse_chunk(chunk, sql)
        if key is not None and key not in cache:
            cache[key] = template(tree.copy(), chunk) or False
        yield tree, None, (cache[key] or None) if key is not None else None, chunk
