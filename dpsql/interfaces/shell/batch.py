"""Batches in the shell: the workload marker, its running cost, and the one-by-one hint.

``BEGIN WORKLOAD;`` (or ``\\begin``) opens a block: each statement typed after it is
checked and collected, not released, and at a terminal the shell shows what the block would
cost and its expected error so far (from :meth:`dpsql.Session.explain`: no data read, nothing
spent; a script's statements are only checked, :meth:`dpsql.Session.check`).
``COMMIT;`` (or ``\\end``) releases the block as ONE workload, through the same path as any
submission (confirmation included); ``ROLLBACK;`` discards it. The marker is recognised by
:mod:`dpsql.sql.marker`, the one place every interface shares.

Statements released one by one against the same table within :data:`WINDOW` seconds: the
shell says once what they would have cost as one workload (ε and expected error, from
``explain``).
"""

from __future__ import annotations

import time

from dpsql.sql.marker import HOW, WorkloadBlock, has_marker, notice_discarded, walk

__all__ = ["WorkloadBlock", "run_sql", "finish", "prompt_of"]

WINDOW = 600.0        # seconds: releases this close together count as "one by one"


def run_sql(ex, sql: str) -> None:
    """Answer ``sql`` (a submission's SQL), applying the workload markers."""
    if not ex.block.is_open and not has_marker(sql):
        parts = ex.state.session.read_plan(sql)      # reading result tables back: free
        for kind, texts in parts or [("answer", [sql])]:
            table = ex.state.session.read_results(texts[0]) if kind == "read" else None
            if table is not None:
                ex.table(table.columns, table.rows, table.name)
                continue
            text = texts[0] if parts is None else ";\n".join(texts)
            release = ex.answer(text)
            if release is None:
                return
            _remember(ex, text, release)
        return
    for step in walk(sql, ex.block):
        if step.kind == "collect":
            _collect(ex, step.text)
        elif step.kind == "notice":
            ex.note(step.text)
        elif step.kind == "answer":
            ex.answer(step.text)
        else:
            ex.note(f"releasing the workload block: {len(step.statements)} statements as "
                    "ONE workload")
            ex.answer("\n".join(step.statements))


def _collect(ex, text: str) -> None:
    """Check the block with ``text`` added, add it and, at a terminal, show the running cost
    (explain). A script (``-f``, ``-e``, piped) only checks it (``Session.check``: parsed and
    compiled, no strategy selected): explaining the block at every statement made a block of
    n statements cost n strategy selections (60 took 52 s, 600 did not end in 10 min); the
    release at ``COMMIT`` says what it spent. A refused statement is not added; the rest of
    its submission is not run."""
    from dpsql.errors import DpsqlError

    block = ex.block
    sql = "\n".join([*block.statements, text])
    try:
        if not ex.state.interactive:
            ex.state.session.check(sql, block=block, **ex.state.request())
            block.add(text)
            return
        expl = ex._explained(sql, ex.state.request())
    except DpsqlError as exc:
        exc.args = (f"{exc}; the statement was not added to the workload block "
                    f"({block.describe()}), nor anything after it in this submission: "
                    "fix it and enter it again, or ROLLBACK; to discard the block",)
        raise
    if expl is None:          # Ctrl-C: not added
        return
    block.add(text)
    ex.state.use(expl.table)
    eps = ("metric epsilon" if ex.state.model == "metric" else "epsilon")
    spend = f"{eps}={expl.epsilon:.4g}" + (f" delta={expl.delta:g}"
                                           if expl.mechanism == "gaussian" else " delta=0")
    ex.note(f"workload block: {block.describe()}, {expl.n_queries} queries on "
            f"{expl.table}; COMMIT; would spend {spend} (strategy {expl.strategy}), "
            f"expected RMSE {expl.rmse:.4g}; ROLLBACK; discards")


def finish(ex, *, interactive: bool) -> None:
    """The shell is leaving: an open block is discarded with a note (nothing charged); in
    batch mode (-e, -f) an unclosed block is an error, as in a script."""
    if not ex.block.is_open:
        return
    count = len(ex.block.close())
    if interactive:
        ex.note("leaving with a workload block open: " + notice_discarded(count))
        return
    from dpsql.errors import WorkloadBlockError

    ex.error(WorkloadBlockError(f"BEGIN WORKLOAD was never committed; end the block with "
                                f"COMMIT; ({notice_discarded(count)})"))


def prompt_of(ex, prompt: str) -> str:
    """The prompt, showing an open block and its size: ``(workload 2) dpsql> ``."""
    if ex.block.is_open:
        return f"(workload {len(ex.block.statements)}) {prompt}"
    return prompt


def _remember(ex, sql: str, release) -> None:
    """Keep the releases entered one by one; after the second on the same table within
    :data:`WINDOW`, say once what one workload would have cost."""
    now = time.monotonic()
    st = ex.state
    plain = (st.model == "dp" and st.target() is None and release.strategy != "reuse"
             and release.epsilon > 0)
    ex.recent = [r for r in ex.recent if now - r[0] <= WINDOW and r[1] == release.table]
    if not plain:
        ex.recent = []
        return
    ex.recent.append((now, release.table, sql, release))
    if len(ex.recent) >= 2 and not ex.hinted:
        ex.hinted = True
        _hint(ex, ex.recent)


def _hint(ex, recent: list) -> None:
    releases = [r[3] for r in recent]
    try:
        expl = ex.state.session.explain("\n".join(r[2] for r in recent),
                                        **dict(ex.state.request(), reuse=False))
    except Exception:      # a hint must never break the shell
        return
    spent = sum(r.epsilon for r in releases)
    ids = ", ".join(str(r.release_id) for r in releases)
    errors = ", ".join(f"{r.expected_rmse:.4g}" for r in releases)
    ex.note(f"note: releases {ids} on {expl.table} were answered one by one: epsilon "
            f"{spent:.4g} in total, expected RMSE {errors}. As ONE workload ({HOW}, or "
            f"entered together) they would have cost epsilon {expl.epsilon:.4g}, expected "
            f"RMSE {expl.rmse:.4g} (from explain). Shown once.")
