"""psql habits in the shell, driven for real through a pseudo-terminal (pexpect): Ctrl-R
history search, Ctrl-G, every default key binding (none may crash the prompt), \\d, \\dt,
\\x, \\o, \\timing, the pager, help / exit / quit typed alone."""

from __future__ import annotations

import io
import os
import sys

import pexpect
import pytest
from prompt_toolkit import PromptSession
from prompt_toolkit.input import DummyInput
from prompt_toolkit.input.ansi_escape_sequences import ANSI_SEQUENCES
from prompt_toolkit.key_binding.bindings.page_navigation import load_page_navigation_bindings
from prompt_toolkit.key_binding.defaults import load_key_bindings
from prompt_toolkit.keys import Keys
from prompt_toolkit.output import DummyOutput

import dpsql
from dpsql.interfaces.shell.executor import submission_complete

from ..conftest import ROOT, make_adult_db
from .test_shell import TIMEOUT, quit_, ready, send, spawn, type_

DRAWN = r"dpsql>"       # the prompt as a full terminal draws it (styled, redrawn)
#: a character (for a binding that waits for one: Ctrl-], Ctrl-V), Ctrl-G (leave a search,
#: menu or selection), Ctrl-End, then four times end of line, kill
#: to its start, backspace: an empty buffer, by keys that never end the prompt (Ctrl-C or
#: Enter could reach the terminal between two prompts, where the line discipline would
#: turn them into a signal)
CLEAR = "x\x07\x1b[1;5F" + "\x05\x15\x08" * 4

GROUP_AGE = "SELECT age, COUNT(*) FROM adult GROUP BY age;"      # 74 rows: taller than 50


@pytest.fixture
def adult(tmp_path):
    path = str(tmp_path / "adult.duckdb")
    make_adult_db(path, epsilon=1.0, delta=1e-5).close()
    return path


def full_terminal(path, tmp_path):
    """The shell in a full (xterm) terminal, where prompt_toolkit draws search and menus; no
    cursor-position requests (PROMPT_TOOLKIT_NO_CPR), output recorded in ``child.log``."""
    env = dict(os.environ, TERM="xterm", PROMPT_TOOLKIT_NO_CPR="1",
               DPSQL_HISTORY=str(tmp_path / "history"), PYTHONPATH=str(ROOT))
    child = pexpect.spawn(sys.executable, ["-m", "dpsql.interfaces.shell", path], env=env,
                          cwd=str(ROOT), encoding="utf-8", timeout=TIMEOUT,
                          dimensions=(50, 250))
    child.logfile_read = child.log = io.StringIO()
    child.expect(DRAWN)
    return child


def run(child, keys: str, *expected: str) -> None:
    """Type keys in the full terminal; wait for each expected text, then the prompt."""
    ready(child)
    child.send(keys)
    for text in expected:
        child.expect_exact(text)
    child.expect(DRAWN)


def no_crash(child) -> None:
    text = child.log.getvalue()
    assert "Traceback" not in text and "Unhandled exception" not in text
    assert "Press ENTER to continue" not in text


def test_ctrl_r_finds_history_and_ctrl_g_abandons_the_search(adult, tmp_path):
    child = full_terminal(adult, tmp_path)
    run(child, "\\tables\r", "hours_per_week")
    run(child, "\\set epsilon 0.25\r", "epsilon = 0.25")
    ready(child)
    child.send("\x12tabl")               # Ctrl-R: reverse search of the history
    child.expect_exact("reverse-i-search")
    run(child, "\r\r", "eps_left")        # accept the found line (\tables), then run it
    ready(child)
    child.send("\x12eps")                # Ctrl-R again, then Ctrl-G: abandon the search
    child.expect_exact("reverse-i-search")
    run(child, "\x07\x03")               # (this crashed the prompt before) then clear
    run(child, "\\set epsilon\r", "epsilon = 0.25")     # alive, nothing changed
    child.send("\\q\r")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    no_crash(child)


def _sequence(keys) -> str | None:
    """The bytes a terminal sends for a binding's keys, or None for events that are not
    typed (mouse, cursor-position reports, signals)."""
    by_key: dict = {}
    for seq, key in ANSI_SEQUENCES.items():
        if isinstance(key, Keys) and (key not in by_key or len(seq) < len(by_key[key])):
            by_key[key] = seq
    by_key.update({Keys.Escape: "\x1b", Keys.ControlM: "\r", Keys.ControlJ: "\n",
                   Keys.ControlI: "\t", Keys.ControlH: "\x08", Keys.Any: "a",
                   Keys.BracketedPaste: "\x1b[200~pasted\x1b[201~"})
    out = ""
    for key in keys:
        if isinstance(key, str) and not isinstance(key, Keys) and len(key) == 1:
            out += key
        elif key in by_key:
            out += by_key[key]
        else:
            return None
    return out


def default_bindings() -> list[str]:
    """Every key sequence prompt_toolkit binds by default in a PromptSession like the
    shell's (emacs and vi, search, completion, auto-suggest), typed as a terminal would."""
    session = PromptSession(input=DummyInput(), output=DummyOutput(), multiline=True,
                            complete_while_typing=True)
    seen = []
    every = (load_key_bindings().bindings + load_page_navigation_bindings().bindings
             + session.app.key_bindings.bindings)
    for binding in every:
        seq = _sequence(binding.keys)
        if seq is not None and seq not in seen:
            seen.append(seq)
    return seen


@pytest.mark.slow   # 277 key sequences in a pseudo-terminal; Ctrl-R/Ctrl-G stay in the default run
def test_every_default_key_binding_leaves_the_prompt_working(adult, tmp_path):
    sequences = default_bindings()
    assert len(sequences) > 50 and "\x07" in sequences and "\x12" in sequences
    child = full_terminal(adult, tmp_path)
    # each binding after some text, then in a search, then back to an empty line; a command
    # whose answer shows the prompt still reads keys ends each group. Keys that may end
    # the prompt (Ctrl-C, Enter, Ctrl-D) get a group of their own, so no key reaches the
    # terminal between two prompts (where Ctrl-S or Ctrl-Z would act on the terminal)
    typed = [before + seq + CLEAR for seq in sequences
             for before in ("SELECT se", "SELECT se\x12SEL")]
    group: list[str] = []
    for k, keys in enumerate(typed):
        group.append(keys)
        if len(group) == 12 or k == len(typed) - 1 or any(c in keys for c in "\x03\r\n\x04"):
            run(child, "".join(group) + "\\set model\r", "model = dp")
            group = []
    run(child, "\\budget\r", "eps_spent")
    child.send("\\q\r")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    no_crash(child)


def test_psql_habits_d_dt_x_o_timing_help_exit(adult, tmp_path):
    child = spawn(adult, "--epsilon", "0.1", "--delta", "1e-6", tmp_path=tmp_path)
    send(child, "\\d", "eps_left", "age, sex, race, income, hours_per_week")
    send(child, "\\dt", "age, sex, race, income, hours_per_week")
    send(child, "\\d adult", "17 .. 90", "'Female', 'Male'")
    send(child, "\\d nosuch", "error: table 'nosuch' is not protected")
    send(child, "help", "ONE workload", "BEGIN WORKLOAD;", "\\timing")
    send(child, "\\timing", "Timing is on.")
    send(child, "\\dt", "eps_left", "Time: ")
    send(child, "\\timing off", "Timing is off.")
    send(child, "\\x", "Expanded display is on.")
    send(child, "\\dt", "-[ RECORD 1 ]", "table      | adult")
    send(child, "\\x auto", "Expanded display is used automatically.")
    send(child, "\\x sideways", "error: \\x takes on, off or auto")
    send(child, "\\x off", "Expanded display is off.")
    out_file = tmp_path / "answers.txt"
    send(child, f"\\o {out_file}", "results go to")
    out = send(child, "SELECT sex, COUNT(*) FROM adult GROUP BY sex;", "charged epsilon=0.1")
    assert "Female" not in out                   # the table went to the file
    send(child, "\\o", "results go to the terminal")
    assert "Female" in out_file.read_text() and "ci_high" in out_file.read_text()
    send(child, "\\o /no/such/dir/x.txt", "error: \\o cannot write")
    type_(child, "quit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    child = spawn(adult, tmp_path=tmp_path)
    type_(child, "exit;")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_results_taller_than_the_screen_go_through_the_pager(adult, tmp_path, monkeypatch):
    pager = tmp_path / "pager.py"
    pager.write_text("import sys\nfor line in sys.stdin:\n    print('paged:', line, end='')\n")
    monkeypatch.setenv("PAGER", f"{sys.executable} {pager}")
    child = spawn(adult, "--epsilon", "0.1", "--delta", "1e-6", "--confirm-share", "1",
                  "--no-reuse", tmp_path=tmp_path)
    send(child, GROUP_AGE, "paged: release 1 on adult", "paged: dp_r1_q1",
         "charged epsilon=0.1")
    out = send(child, "SELECT sex, COUNT(*) FROM adult GROUP BY sex;", "Female")
    assert "paged:" not in out                   # short results are printed directly
    send(child, "\\pset pager off", "Pager usage is off.")
    out = send(child, GROUP_AGE, "charged epsilon=0.1")
    assert "paged:" not in out
    send(child, "\\pset pager always", "Pager is always used.")
    send(child, "\\dt", "paged: table")
    send(child, "\\pset", "pager is always")
    quit_(child)
    with dpsql.connect(adult) as s:
        assert len(s.ledger()) == 3


@pytest.mark.parametrize("text", ["exit", "quit", "help", " EXIT; ", "\\q"])
def test_words_alone_submit(text):
    assert submission_complete(text)
