"""The privacy boundary, enforced on the source: who may import and call what."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "dpsql"

#: modules that must stay public-only: no engine, no kernel, no session, no duckdb
PUBLIC_ONLY = ["dpsql.workload.domain", "dpsql.policy.policy", "dpsql.noise.accounting", "dpsql.inference.least_squares",
               "dpsql.sql.parse", "dpsql.sql.compile", "dpsql.sql.script", "dpsql.strategies",
               "dpsql.strategies.synthetic", "dpsql.policy.metric", "dpsql.policy.record_metric", "dpsql.mechanisms.dx.scales", "dpsql.mechanisms.dx.mechanisms",
               "dpsql.mechanisms.mwem.core", "dpsql.mechanisms.mwem.groups", "dpsql.mechanisms.mwem.options", "dpsql.mechanisms.mwem.state",
               "dpsql.noise.laplace", "dpsql.inference.intervals"]
FORBIDDEN = {"dpsql.store.database", "dpsql.kernel", "dpsql.session", "dpsql.store.ledger", "duckdb"}


def _forbidden(module: str) -> bool:
    """A forbidden module, or one inside a forbidden package (the kernel's modules)."""
    return any(module == f or module.startswith(f + ".") for f in FORBIDDEN)


def _path(module: str) -> Path:
    rel = Path(*module.split(".")[1:])
    pkg = PKG / rel / "__init__.py"
    return pkg if pkg.exists() else (PKG / rel).with_suffix(".py")


def _imports(module: str) -> set[str]:
    path = _path(module)
    tree = ast.parse(path.read_text())
    is_pkg = path.name == "__init__.py"
    base = module.split(".") if is_pkg else module.split(".")[:-1]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parent = base[: len(base) - (node.level - 1)]
                mod = ".".join(parent + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.add(mod)
            for a in node.names:  # `from . import x` may name a submodule
                cand = f"{mod}.{a.name}"
                if _path(cand).exists() if cand.startswith("dpsql.") else False:
                    out.add(cand)
    return out


def _closure(module: str) -> set[str]:
    seen, todo = set(), [module]
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        for imp in _imports(m):
            if imp.startswith("dpsql.") and _path(imp).exists():
                todo.append(imp)
            else:
                seen.add(imp)
    return seen


def test_public_modules_never_reach_data():
    for module in PUBLIC_ONLY:
        reached = _closure(module)
        bad = {m for m in reached if _forbidden(m) or m.split(".")[0] == "duckdb"}
        assert not bad, f"{module} imports {bad}"


def test_strategy_modules_are_public_only():
    for path in (PKG / "strategies").glob("*.py"):
        module = "dpsql.strategies." + path.stem
        assert not {m for m in _closure(module) if _forbidden(m)}, module


def test_only_the_kernel_reads_the_data_vector():
    """Outside the engines themselves (each engine's data_vector calls the shared one in
    dpsql/engines/base.py), only the kernel's data module names the data vector."""
    callers = []
    for path in PKG.rglob("*.py"):
        if path.parent == PKG / "engines":
            continue
        tree = ast.parse(path.read_text())
        name = str(path.relative_to(ROOT))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "data_vector":
                callers.append(name)
            if isinstance(node, ast.Name) and node.id == "data_vector":
                callers.append(name)
    assert set(callers) <= {"dpsql/kernel/data.py"}, callers


def test_no_insecure_randomness_in_the_package():
    for path in PKG.rglob("*.py"):
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#")[0]
            if "np.random" in code or "numpy.random" in code or "import random" in code:
                assert line.rstrip().endswith("# test-only"), f"{path.name}:{lineno}: {line}"


def test_no_assert_statements_in_library_code():
    for path in PKG.rglob("*.py"):
        tree = ast.parse(path.read_text())
        asserts = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Assert)]
        assert not asserts, f"{path.name} uses assert at lines {asserts}"
