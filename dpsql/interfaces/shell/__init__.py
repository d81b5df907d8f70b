"""The interactive dpsql shell (``dpsql shell DB``) and its batch modes (``-e``, ``-f``).

Layout, after litecli / pgcli: ``app`` parses arguments and runs a batch or the REPL,
``repl`` is the prompt_toolkit loop, ``executor`` turns one submission into one workload (or
meta-commands), ``batch`` applies the workload marker (``BEGIN WORKLOAD; ... COMMIT;``,
:mod:`dpsql.sql.marker`) with its running cost, ``display`` lays results out as psql does
(``\\x``, ``\\o``, the pager, ``\\timing``), ``metacommands`` holds the backslash commands
(registered with a decorator), ``completer`` completes SQL, ``settings`` validates what
``\\set`` accepts and ``progress`` draws the spinner. Nothing here reads data: every number
shown comes from a :class:`dpsql.Session` release, explanation, budget or ledger.
"""

from dpsql.interfaces.shell.app import main

__all__ = ["main"]
