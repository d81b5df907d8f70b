"""An in-process memo of parsed and compiled batches (public inputs only).

Parsing and compiling cost about a millisecond per statement, which a repeated batch of
hundreds of statements (a strategy-cache hit) should not pay again. The memo is a bounded
LRU (:data:`MAX_ENTRIES`) keyed by the SQL text(s) exactly as given and the canonical
serialisation (``to_json``) of every protected table's policy (the parse resolves table
names against all of them). A batch that fails to parse or compile is not remembered: it
raises the same error every time.

What it returns cannot corrupt it: queries are frozen dataclasses (returned in a new list),
and a compiled :class:`~dpsql.sql.compile.Workload` is immutable (read-only arrays, tuples;
see :mod:`dpsql.sql.compile`); each caller gets its own shallow copy of the workload, so
attributes a caller attaches (``selection.workload_info`` caches the dense Gram matrix on
it) are not kept alive by the memo. The copy carries the memo's :func:`workload_hash` of
``W``.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import replace

from dpsql.sql.compile import Workload, compile_workload, workload_hash

#: batches remembered (least recently used dropped first)
MAX_ENTRIES = 32

_lock = threading.Lock()
_entries: OrderedDict = OrderedDict()


class _Entry:
    __slots__ = ("queries", "workload", "w_hash", "implicit")

    def __init__(self, queries: tuple):
        self.queries = queries
        self.workload = None
        self.w_hash = None
        self.implicit = None


def batch_key(sql, policies) -> tuple | None:
    """The memo key of a batch, or None when ``sql`` is not text (then nothing is memoised
    and the parser reports the problem)."""
    if isinstance(sql, str):
        texts = ("text", sql)
    elif isinstance(sql, (list, tuple)) and all(isinstance(t, str) for t in sql):
        texts = ("texts", tuple(sql))
    else:
        return None
    return texts, tuple(sorted((name, p.to_json()) for name, p in policies.items()))


def _get(key) -> _Entry | None:
    with _lock:
        entry = _entries.get(key)
        if entry is not None:
            _entries.move_to_end(key)
        return entry


def parsed(key, parse) -> list:
    """The queries of a batch: remembered, or ``parse()`` (a list of queries)."""
    entry = _get(key) if key is not None else None
    if entry is None:
        queries = tuple(parse())
        if key is None:
            return list(queries)
        entry = _Entry(queries)
        with _lock:
            entry = _entries.setdefault(key, entry)
            _entries.move_to_end(key)
            while len(_entries) > MAX_ENTRIES:
                _entries.popitem(last=False)
    return list(entry.queries)


def compiled(key, queries: list, policy, implicit: bool = False) -> Workload:
    """The compiled workload of a batch (``queries`` as :func:`parsed` returned them for
    ``key``, on ``policy``'s table): remembered, or compiled now. ``implicit``: as
    :func:`dpsql.sql.implicit.compile_batch` compiles it (Kronecker blocks above its
    threshold), for the matrix mechanism; else always the dense form."""
    entry = _get(key) if key is not None else None
    if implicit:
        return _compiled_batch(entry, queries, policy)
    if entry is None:
        return compile_workload(queries, policy)
    return _dense_copy(entry, policy)


def _dense_copy(entry, policy) -> Workload:
    if entry.workload is None:
        workload = compile_workload(list(entry.queries), policy)
        w_hash = workload_hash(workload.W)
        with _lock:
            if entry.workload is None:
                entry.workload, entry.w_hash = workload, w_hash
    copy = replace(entry.workload)
    object.__setattr__(copy, "_w_hash", entry.w_hash)
    return copy


def clear() -> None:
    """Forget every batch (tests)."""
    with _lock:
        _entries.clear()


def _compiled_batch(entry, queries: list, policy):
    """:func:`compiled` for the matrix mechanism: the dense form when the batch is small."""
    from dpsql.sql.implicit import compile_batch

    if entry is None:
        return compile_batch(queries, policy)
    if entry.implicit is None:
        workload = compile_batch(list(entry.queries), policy)
        dense = not getattr(workload, "implicit", False)
        w_hash = workload_hash(workload.W) if dense else None
        with _lock:
            if entry.implicit is None:
                entry.implicit = False if dense else workload
            if dense and entry.workload is None:     # small: the dense form, remembered
                entry.workload, entry.w_hash = workload, w_hash
    if entry.implicit is False:
        return _dense_copy(entry, policy)
    return entry.implicit
