"""One submission in, answers out: every SQL run of a submission is ONE workload.

A submission is the text the analyst entered at once. Its SQL lines are answered together
by one :meth:`dpsql.Session.answer` call; a line starting with a backslash is a
meta-command. SQL that precedes a meta-command is answered first when it is complete (ends
with ``;``), explained by an argument-less ``\\explain``, and otherwise discarded.

Accuracy first (``\\set target_rmse`` / ``\\set max_stderr``): the submission is explained
first, the smallest epsilon meeting the target is shown with its delta and strategy, and it
is spent only after a yes (or with ``\\set confirm on``); without a terminal to ask on, it is
refused and nothing is spent.

Reuse (on unless ``\\set reuse off``): a submission that past releases answer in full costs
nothing, so it is never asked about; its release is recorded at zero cost.

Errors print as one line (``error: ...``); dpsql's own messages never contain data values,
and anything unexpected prints only its exception type.
"""

from __future__ import annotations

import csv
import re
import signal
import time
from fractions import Fraction

from dpsql.errors import (EX_DATAERR, EXIT_INTERRUPTED, DpsqlError, NoTerminal, Terminated,
                          exit_status, one_line)
from dpsql.session import InterruptedAfterRelease
from dpsql.sql.parse import parse_batch
from dpsql.interfaces.shell import batch, display, metacommands
from dpsql.interfaces.shell.progress import progress
from dpsql.interfaces.shell.settings import show_exact, show_target

MAX_ROWS = 1000      # rows printed per result table (all of them are in the database)
_COMMENT = re.compile(r"--[^']*$")


def ends_statement(line: str) -> bool:
    """Does this line end a SQL statement (``;`` last, ignoring a trailing comment)?"""
    if line.count("'") % 2 == 0:
        line = _COMMENT.sub("", line)
    return line.rstrip().endswith(";")


def is_meta(line: str) -> bool:
    return line.lstrip().startswith("\\")


#: words typed alone that act as in psql: leave, or show the help
WORDS = {"exit": "\\q", "quit": "\\q", "help": "\\help"}


def word_alone(text: str) -> str | None:
    """The meta-command of ``exit``, ``quit`` or ``help`` typed alone (``;`` allowed)."""
    return WORDS.get(text.strip().rstrip(";").strip().lower())


def submission_complete(text: str) -> bool:
    """Should Enter submit ``text``? Empty, last line ends with ``;`` or is a meta-command,
    or the text is ``exit``, ``quit`` or ``help`` alone."""
    if not text.strip() or word_alone(text):
        return True
    last = text.rstrip("\n").split("\n")[-1]
    return ends_statement(last) or is_meta(last)


def release_head(release) -> str:
    """The first line of a release; ``expected RMSE=n/a`` when the error is data-dependent
    (MWEM) rather than ``nan``."""
    return str(release).split("\n", 1)[0].replace("expected RMSE=nan", "expected RMSE=n/a")


class _Unprotected(Exception):
    """parse for the confirmation check met a table that is not protected."""


SKIP_SHARE = "pass --confirm-share 1 to spend it without asking"
SKIP_TARGET = "pass --confirm (or \\set confirm on) to spend it without asking"


class Executor:
    """Runs submissions against a :class:`~dpsql.interfaces.shell.settings.ShellState`."""

    def __init__(self, state, out, err, confirm, *, csv_output: bool = False,
                 show_progress: bool = False, stop_on_error: bool = False):
        self.state = state
        self.out = out
        self.err = err
        self.confirm = confirm          # reason -> bool (ask y/N)
        self.csv_output = csv_output
        self.show_progress = show_progress
        self.stop_on_error = stop_on_error
        self.failed = False             # any error so far
        self.status = 0                 # exit status of the first error (dpsql.errors table)
        self.cancelled = False          # a request was stopped by Ctrl-C
        self.display = display.Display()   # \x, \o, \pset pager, \timing
        self.block = batch.WorkloadBlock()  # BEGIN WORKLOAD ... COMMIT (dpsql.sql.marker)
        self.recent: list = []          # releases entered one by one (batch.hint)
        self.hinted = False             # the one-by-one hint is said once

    # ------------------------------------------------------------------ output
    def say(self, text: str = "") -> None:
        print(text, file=self.out, flush=True)

    def note(self, text: str) -> None:
        """Remarks that are not results (to stderr in CSV mode, keeping stdout clean)."""
        print(text, file=self.err if self.csv_output else self.out, flush=True)

    def error(self, error: BaseException | str) -> None:
        """Print an error as one line; the first one sets the batch's exit status."""
        self.failed = True
        if not self.status:
            self.status = exit_status(error) if isinstance(error, BaseException) else EX_DATAERR
        message = one_line(error) if isinstance(error, BaseException) else error
        print(f"error: {message}", file=self.err, flush=True)

    @property
    def results(self):
        """Where results go: the file of ``\\o FILE``, else the output."""
        return self.display.file or self.out

    def emit(self, text: str) -> None:
        """Results: to ``\\o``'s file or the output, paged when taller than the screen."""
        display.emit(self.display, self.results, text,
                     interactive=self.state.interactive)

    # ------------------------------------------------------------------ submissions
    def submit(self, text: str) -> bool:
        """Run one submission; False when the shell should exit. ``exit``, ``quit`` and
        ``help`` typed alone are ``\\q`` and ``\\help``; ``\\timing`` times it."""
        word = word_alone(text)
        if word:
            text = word
        started = time.perf_counter()
        try:
            return self._submit(text)
        finally:
            if self.display.timing:
                self.note(f"Time: {(time.perf_counter() - started) * 1000:.3f} ms")

    def _submit(self, text: str) -> bool:
        pending: list[str] = []
        for line in text.split("\n"):
            if not is_meta(line):
                pending.append(line)
                continue
            sql = "\n".join(pending).strip()
            pending = []
            name, arg = (line.strip().split(None, 1) + [""])[:2]
            name, arg = name.rstrip(";"), arg.strip().rstrip(";").strip()
            if sql and name == "\\explain" and not arg:
                arg = sql
            elif sql and ends_statement(sql.split("\n")[-1]):
                self.guarded(batch.run_sql, self, sql)
                if self.failed and self.stop_on_error:
                    return True
            elif sql:
                self.note("(unfinished statement discarded: end a statement with ;)")
            if self.guarded(metacommands.run, self, name, arg) is False:
                return False
            if self.failed and self.stop_on_error:
                return True
        sql = "\n".join(pending).strip()
        if sql:
            self.guarded(batch.run_sql, self, sql)
        return True

    def guarded(self, fn, *args):
        """Call ``fn``; print any error as one line. Returns fn's value (None on error)."""
        try:
            return fn(*args)
        except KeyboardInterrupt as exc:
            self._cancel("cancelled")
            stop_if_terminated(exc)
        except BrokenPipeError:
            raise           # the reader of our output went away: app.main exits quietly
        except Exception as exc:  # never a traceback: a non-dpsql one could carry data
            self.error(exc)         # its row in dpsql.errors.ERROR_TABLE (internal: 70)
        finally:
            try:
                self.state.refresh()
            except Exception:
                pass
        return None

    # ------------------------------------------------------------------ requests
    def explain(self, sql: str) -> None:
        st = self.state
        expl = self._explained(sql, st.request())
        if expl is None:
            return
        st.use(expl.table)
        self.say(str(expl))
        target = st.target()
        found = (f"the smallest epsilon meeting {target[0]} {show_target(target[1])} is "
                 f"{expl.epsilon:g}; " if target is not None else "")
        self.note(f"({found}explain reads no data and spends nothing)")

    def _explained(self, sql: str, request: dict):
        """The explanation of ``sql`` under ``request``, or None when Ctrl-C cancelled it."""
        what = ("finding the smallest epsilon" if self.state.target() is not None
                else "selecting a strategy")
        try:
            with progress(what, self.err, enabled=self.show_progress):
                return self.state.session.explain(sql, **request)
        except KeyboardInterrupt as exc:
            self._cancel("cancelled; nothing was spent")
            stop_if_terminated(exc)
            return None

    def answer(self, sql: str) -> None:
        st = self.state
        request = st.request()
        model = st.model
        table = self._table_of(sql)
        confirmed = None
        if st.target() is not None:
            expl = self._explained(sql, request)
            if expl is None:
                return
            if not self._confirmed_target(expl, request["delta"]):
                self.note("not answered; nothing was spent")
                return
            confirmed = expl.epsilon
            request = dict(request, confirm=True)
        elif table is not None:
            ok = self._confirmed(table, request["epsilon"], model, request["delta"], sql)
            if not ok:
                if ok is False:
                    self.note("not answered; nothing was spent")
                return
        before = self._last_release_id()
        try:
            with progress("answering", self.err, enabled=self.show_progress):
                release = st.session.answer(sql, **request, **st.flags())
        except InterruptedAfterRelease as exc:
            self._print_release(exc.release, model)
            self._cancel(f"interrupted, but release {exc.release.release_id} had already "
                         "been charged; it was completed and is shown above")
            stop_if_terminated(exc)
            return
        except KeyboardInterrupt as exc:
            charged = [e for e in st.session.ledger()
                       if e["release_id"] > before and e["sql_text"] == sql]
            if charged:
                self._cancel(f"interrupted after the charge: release "
                             f"{charged[-1]['release_id']} was charged (status "
                             f"{charged[-1]['status']}); see \\ledger")
            else:
                self._cancel("cancelled; nothing was charged")
            stop_if_terminated(exc)
            return
        self._print_release(release, model)
        if confirmed is not None and release.epsilon > confirmed:
            self.note(f"note: epsilon={release.epsilon:g} was charged, not the {confirmed:g} "
                      "confirmed: the table's policy or past releases changed meanwhile")
        return release

    # ------------------------------------------------------------------ helpers
    def _cancel(self, message: str) -> None:
        """Ctrl-C stopped a request: say what was (not) charged; a batch stops here."""
        self.failed = self.cancelled = True
        self.status = self.status or EXIT_INTERRUPTED
        self.note(message)

    def _print_release(self, release, model: str = "dp") -> None:
        self.state.use(release.table)
        head = release_head(release)
        if self.csv_output:
            self.note(head)
            writer = csv.writer(self.results, lineterminator="\n")
            for i, result in enumerate(release.results):
                if i:
                    self.results.write("\n")
                writer.writerow(result.columns)
                writer.writerows(["" if v is None else v for v in row] for row in result.rows)
            self.results.flush()
        else:
            self.emit("\n\n".join([head] + [
                display.render(self.display, r.columns, r.rows, r.name, MAX_ROWS)
                for r in release.results]))
        budget = self.state.budget
        metric = self.state.metric_budget()
        if model == "metric" and metric is not None:
            self.note(f"charged metric epsilon={show_exact(release.epsilon)} (per unit "
                      f"distance) to {release.table}; remaining metric epsilon "
                      f"{show_exact(metric[0])} of {show_exact(metric[1])}")
        elif budget is not None:
            charged = ("answered from past releases: nothing charged"
                       if release.strategy == "reuse" else
                       f"charged epsilon={show_exact(release.epsilon)} "
                       f"delta={show_exact(release.delta)}")
            self.note(f"{charged} to {release.table}; remaining "
                      f"epsilon {show_exact(budget['epsilon_remaining'])} of "
                      f"{show_exact(budget['epsilon_limit'])}, delta "
                      f"{show_exact(budget['delta_remaining'])} of "
                      f"{show_exact(budget['delta_limit'])}")

    def _table_of(self, sql: str) -> str | None:
        """The protected table a batch reads, or None (answer() will refuse it itself)."""
        policies = self.state.session.policies()

        def resolve(name, node):
            if name not in policies:
                raise _Unprotected(name)
            return policies[name]

        try:
            queries = parse_batch(sql, resolve)
        except (DpsqlError, _Unprotected):
            return None
        return queries[0].table if queries else None

    def _ask(self, reason: str, skip: str) -> bool:
        """Ask the analyst; without a terminal, refuse and say how to skip the question."""
        try:
            return bool(self.confirm(reason))
        except NoTerminal as exc:
            raise NoTerminal(f"{exc}; {skip}") from None

    def _confirmed_target(self, expl, delta) -> bool:
        """Accuracy first: show the smallest epsilon found (with delta and strategy) and ask
        before spending it, unless ``confirm`` is on (the share threshold still applies)."""
        st = self.state
        key, value = st.target()
        eps = Fraction(repr(expl.epsilon))
        left = st.session.budget(expl.table)["epsilon_remaining"]
        if eps == 0 or eps > left:
            return True   # nothing to spend (past releases answer it), or refused by answer()
        if st.confirm:
            return self._confirmed(expl.table, eps, "dp", delta)
        spent_delta = delta if expl.mechanism == "gaussian" else 0
        noise = {"gaussian": "Gaussian", "laplace": "Laplace"}.get(expl.mechanism,
                                                                  expl.mechanism)
        reason = (f"{key} {show_target(value)} needs epsilon={show_exact(eps)} "
                  f"delta={show_exact(spent_delta)} (strategy {expl.strategy}, {noise} noise, "
                  f"expected RMSE {expl.rmse:.4g}): {float(eps / left) * 100:.0f}% of the "
                  f"{show_exact(left)} remaining on table {expl.table!r}")
        return self._ask(reason, SKIP_TARGET)

    def _confirmed(self, table: str, epsilon, model: str = "dp", delta=None,
                   sql: str | None = None) -> bool | None:
        """Ask before spending more than ``confirm_share`` of the remaining epsilon (of the
        metric budget, for a metric release). With ``sql`` and reuse on, a batch that past
        releases answer in full (nothing to spend) is not asked about; None: Ctrl-C
        cancelled that check."""
        budget = self.state.session.budget(table)
        what = "epsilon"
        left = budget["epsilon_remaining"]
        if model == "metric":
            if "metric_epsilon_remaining" not in budget or delta:
                return True   # no metric model, or delta > 0: answer() refuses it, and says why
            what, left = "metric epsilon", budget["metric_epsilon_remaining"]
        share = self.state.confirm_share
        if epsilon > left or epsilon <= share * left:
            return True   # within the threshold, or refused by answer() with the numbers
        if sql is not None and model == "dp" and self.state.reuse:
            expl = self._explained(sql, self.state.request())
            if expl is None:
                return None
            if expl.mechanism == "reuse":
                return True   # past releases answer all of it: nothing is spent
        reason = (f"this spends {what}={show_exact(epsilon)}, "
                  f"{float(epsilon / left) * 100:.0f}% of the {show_exact(left)} remaining "
                  f"on table {table!r} (above the {float(share) * 100:g}% confirmation "
                  "threshold)")
        return self._ask(reason, SKIP_SHARE)

    def _last_release_id(self) -> int:
        return max((e["release_id"] for e in self.state.session.ledger()), default=0)

    def table(self, columns, rows, title=None) -> None:
        """Print rows as an aligned table (or CSV in CSV mode)."""
        if self.csv_output:
            writer = csv.writer(self.results, lineterminator="\n")
            writer.writerow(columns)
            writer.writerows(["" if v is None else v for v in row] for row in rows)
            self.results.flush()
        else:
            self.emit(display.render(self.display, columns, rows, title, MAX_ROWS))


def stop_if_terminated(exc: BaseException) -> None:
    """SIGTERM ends the shell (after saying what was charged): re-raise it; Ctrl-C does not."""
    if isinstance(exc, Terminated) or getattr(exc, "signum", None) == signal.SIGTERM:
        raise exc
