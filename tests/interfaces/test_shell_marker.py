"""Batches in the shell, driven for real through a pseudo-terminal (pexpect): a workload block
typed line by line is ONE release, a pasted block too, ROLLBACK charges nothing, and
releases entered one by one get the one-time hint of what one workload would have cost."""

from __future__ import annotations

import pexpect
import pytest

import dpsql

from ..conftest import make_adult_db
from .test_shell import PROMPT, batch, quit_, ready, send, spawn, type_

Q1 = "SELECT sex, COUNT(*) FROM adult GROUP BY sex;"
Q2 = "SELECT COUNT(*) FROM adult WHERE age >= 40;"
Q3 = "SELECT race, COUNT(*) FROM adult GROUP BY race;"


@pytest.fixture
def adult(tmp_path):
    path = str(tmp_path / "adult.duckdb")
    make_adult_db(path, epsilon=1.0, delta=1e-5).close()
    return path


def ledger(path):
    with dpsql.connect(path) as s:
        return s.ledger()


def test_a_block_typed_line_by_line_is_one_release(adult, tmp_path):
    child = spawn(adult, "--epsilon", "0.1", "--delta", "1e-6", tmp_path=tmp_path)
    send(child, "BEGIN WORKLOAD;")
    costs = []
    for k, sql in enumerate((Q1, Q2, Q3), 1):
        out = send(child, sql, f"workload block: {k} statement", "expected RMSE", "discards")
        assert out.endswith(f"(workload {k}) {PROMPT}")    # the prompt shows the block
        costs.append(out)
        assert ledger(adult) == []                     # collected, not released
    assert "COMMIT; would spend epsilon=0.1" in costs[-1]
    out = send(child, "COMMIT;", "releasing the workload block: 3 statements as ONE workload",
               "dp_r1_q3", "charged epsilon=0.1", "remaining epsilon 0.9 of 1")
    assert "dp_r1_q1" in out and "dp_r1_q2" in out
    # \begin ... \end are the same marker; ROLLBACK discards and charges nothing
    send(child, "\\begin")
    send(child, Q1, "workload block: 1 statement")
    send(child, "ROLLBACK;", "workload block discarded (1 statement collected); nothing "
                             "was charged")
    send(child, "\\begin")
    send(child, "SELECT name, COUNT(*) FROM adult GROUP BY name;",
         "error: column 'name'", "not added to the workload block (0 statements collected)")
    send(child, "\\begin", "error: BEGIN WORKLOAD: a workload block is already open")
    send(child, Q2, "workload block: 1 statement")
    send(child, "\\end", "releasing the workload block: 1 statements", "charged epsilon=0.1")
    send(child, "COMMIT;", "COMMIT with no workload block open: nothing to release")
    send(child, "BEGIN;", "BEGIN alone does not batch")
    quit_(child)
    entries = ledger(adult)                              # one entry per block, one epsilon
    assert [(e["epsilon"], len(e["result_tables"])) for e in entries] == [(0.1, 3), (0.1, 1)]
    assert entries[0]["n_queries"] > 3


def test_a_pasted_block_is_one_release_and_leaving_discards(adult, tmp_path):
    child = spawn(adult, "--epsilon", "0.1", "--delta", "1e-6", tmp_path=tmp_path)
    ready(child)
    # pasted at once (a terminal's bracketed paste): one submission holding the whole block
    child.send("\x1b[200~BEGIN WORKLOAD;\n" + Q1 + "\n" + Q2 + "\nCOMMIT;\x1b[201~\r")
    child.expect_exact("workload block: 1 statement")
    child.expect_exact("releasing the workload block: 2 statements as ONE workload")
    child.expect_exact("charged epsilon=0.1")
    child.expect_exact(PROMPT)
    # a block still open when the shell leaves is discarded, nothing charged
    send(child, "BEGIN WORKLOAD;")
    send(child, Q3, "workload block: 1 statement")
    type_(child, "exit")
    child.expect_exact("leaving with a workload block open: workload block discarded")
    child.expect_exact("nothing was charged")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    (entry,) = ledger(adult)
    assert len(entry["result_tables"]) == 2


def test_one_by_one_releases_get_the_batch_hint_once(adult, tmp_path):
    child = spawn(adult, "--epsilon", "0.1", "--delta", "1e-6", tmp_path=tmp_path)
    send(child, Q1, "charged epsilon=0.1")
    out = send(child, Q2, "note: releases 1, 2 on adult were answered one by one: epsilon "
                          "0.2 in total", "As ONE workload", "would have cost epsilon 0.1",
               "Shown once.")
    assert "expected RMSE" in out
    out = send(child, Q3, "charged epsilon=0.1")
    assert "one by one" not in out                      # said once
    quit_(child)
    assert len(ledger(adult)) == 3


def test_batch_mode_blocks_span_e_strings_and_must_be_closed(adult):
    done = batch(adult, "--epsilon", "0.1", "--delta", "1e-6", "-e", "BEGIN WORKLOAD;",
                 "-e", Q1, "-e", Q2, "-e", "COMMIT;")
    assert done.returncode == 0, done.stderr
    (entry,) = ledger(adult)
    assert len(entry["result_tables"]) == 2
    open_block = batch(adult, "--epsilon", "0.1", "--delta", "1e-6", "-e",
                       "BEGIN WORKLOAD; " + Q1)
    assert open_block.returncode == 65 and "Traceback" not in open_block.stderr
    assert open_block.stderr.startswith("error: BEGIN WORKLOAD was never committed")
    assert len(ledger(adult)) == 1
