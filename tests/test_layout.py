"""The house matches its drawing: layer contracts, no import cycles, size limits.

The layers and the privacy boundary are import-linter contracts in ``pyproject.toml``; this
test runs them in the suite so that the first upward import fails CI. Module and function
sizes are limited there too, with each exception named and justified.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parent.parent
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())
LIMITS = CONFIG["tool"]["dpsql"]["limits"]


def test_import_linter_contracts_hold(monkeypatch):
    from importlinter.cli import lint_imports

    monkeypatch.chdir(ROOT)
    assert lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True,
                        no_logo=True) == 0, "run `lint-imports` to see the broken contract"


def test_no_import_cycles():
    graph = grimp.build_graph("dpsql")
    modules = sorted(m for m in graph.modules if m.startswith("dpsql"))
    edges = {m: {i for i in graph.find_modules_directly_imported_by(m) if i.startswith("dpsql")}
             for m in modules}
    # a package imports its own submodules only as a namespace: not a cycle of code
    cycles, state = [], {}

    def visit(m, stack):
        state[m] = "open"
        stack.append(m)
        for n in edges.get(m, ()):
            if state.get(n) == "open":
                cycles.append(stack[stack.index(n):] + [n])
            elif n not in state:
                visit(n, stack)
        stack.pop()
        state[m] = "done"

    for m in modules:
        if m not in state:
            visit(m, [])
    assert not cycles, f"import cycles: {cycles[:3]}"


def _sources():
    return sorted((ROOT / "dpsql").rglob("*.py"))


def test_modules_stay_small():
    limit, allowed = LIMITS["max_module_lines"], LIMITS["module_exceptions"]
    over = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in _sources()}
    over = {k: n for k, n in over.items() if n > limit}
    unlisted = {k: n for k, n in over.items() if k not in allowed}
    assert not unlisted, f"modules over {limit} lines (split, or justify in pyproject.toml): {unlisted}"
    stale = sorted(set(allowed) - set(over))
    assert not stale, f"remove from [tool.dpsql.limits.module_exceptions], now small: {stale}"


def test_functions_stay_short():
    limit, allowed = LIMITS["max_function_lines"], LIMITS["function_exceptions"]
    over = {}
    for p in _sources():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > limit:
                    over[f"{p.relative_to(ROOT)}:{node.name}"] = n
    unlisted = {k: n for k, n in over.items() if k not in allowed}
    assert not unlisted, f"functions over {limit} lines (split, or justify in pyproject.toml): {unlisted}"
    stale = sorted(set(allowed) - set(over))
    assert not stale, f"remove from [tool.dpsql.limits.function_exceptions], now short: {stale}"


@pytest.mark.parametrize("reason", list(LIMITS["module_exceptions"].values())
                         + list(LIMITS["function_exceptions"].values()))
def test_every_exception_says_why(reason):
    assert isinstance(reason, str) and len(reason.split()) >= 3
