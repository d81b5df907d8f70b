"""SQL fixture files: what the parser/compiler must accept (and compile to), and must reject.

``tests/sql/fixtures/accept.sql`` and ``reject.sql`` are plain text, one case per
``-- case: <name>`` block; their headers document the format. Add a case by appending a block.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from dpsql.errors import ParseError, UnknownTableError
from dpsql.policy.policy import table_policy_from_spec
from dpsql.sql.compile import compile_workload
from dpsql.sql.parse import parse_batch
from dpsql.sql.refusals import _position

FIXTURES = Path(__file__).resolve().parent / "fixtures"

POLICIES = {
    "t": table_policy_from_spec("t", {
        "epsilon": 1, "delta": 0,
        "columns": {
            "a": {"type": "integer", "min": 1, "max": 4},
            "b": {"type": "categorical", "values": ["x", "y"], "nullable": True},
            "h": {"type": "numeric", "min": 0, "max": 10, "edges": [0, 5, 10]},
        },
    }),
    "t2": table_policy_from_spec("t2", {
        "epsilon": 1, "delta": 0,
        "columns": {"a": {"type": "integer", "min": 1, "max": 4}},
    }),
}


def compile_sql(sql):
    """Mirror of ``dpsql.session.Session._compile`` over the fixture policies."""

    def resolve(name, node):
        if name not in POLICIES:
            line, col = _position(node)
            known = ", ".join(sorted(POLICIES))
            raise UnknownTableError(
                f"table {name!r} is not a protected table (protected: {known})", line, col)
        return POLICIES[name]

    queries = parse_batch(sql, resolve)
    policy = POLICIES[queries[0].table]
    return queries, compile_workload(queries, policy)


# --------------------------------------------------------------------------- fixture reader

_DIRECTIVE = re.compile(r"^--\s*([a-z]+):\s?(.*)$")


@dataclass
class Case:
    name: str
    line: int                      # line of `-- case:` in the file
    directives: dict = field(default_factory=dict)  # key -> list of values
    sql: str = ""

    def one(self, key, default=None):
        values = self.directives.get(key)
        if not values:
            return default
        assert len(values) == 1, f"{self.name}: `-- {key}:` given {len(values)} times"
        return values[0]


def read_cases(path: Path, allowed: set) -> list[Case]:
    cases: list[Case] = []
    current: Case | None = None
    in_header = False
    body: list[str] = []

    def finish():
        if current is not None:
            # drop trailing blank lines and whole-line comments (section separators)
            while body and (not body[-1].strip() or body[-1].lstrip().startswith("--")):
                body.pop()
            current.sql = "\n".join(body)
            cases.append(current)

    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        m = _DIRECTIVE.match(line.strip())
        if m and m.group(1) == "case":
            finish()
            current, in_header, body = Case(m.group(2).strip(), number), True, []
            continue
        if current is None:
            continue  # file preamble
        if in_header and line.startswith("--"):
            if m:
                key = m.group(1)
                if key not in allowed:
                    raise AssertionError(f"{path.name}:{number}: unknown directive {key!r}")
                current.directives.setdefault(key, []).append(m.group(2).strip())
            continue  # free comment in the header
        if in_header and not line.strip() and not body:
            continue
        in_header = False
        body.append(line)
    finish()
    names = [c.name for c in cases]
    dupes = {n for n in names if names.count(n) > 1}
    assert not dupes, f"{path.name}: duplicate case names {sorted(dupes)}"
    return cases


ACCEPT = read_cases(FIXTURES / "accept.sql", {"cells", "parts", "rows", "keys", "gids"})
REJECT = read_cases(FIXTURES / "reject.sql", {"error", "at"})


def test_fixture_files_are_not_empty():
    assert len(ACCEPT) >= 40
    assert len(REJECT) >= 60
    assert all(c.sql.strip() for c in ACCEPT + REJECT)


# --------------------------------------------------------------------------- accept


def _parse_parts(text: str) -> dict:
    """``a=0,1|2,3; b=0|1,2|3`` -> {'a': ((0, 1), (2, 3)), 'b': ((0,), (1, 2), (3,))}"""
    out = {}
    for item in text.split(";"):
        col, _, spec = item.strip().partition("=")
        out[col.strip()] = tuple(tuple(int(u) for u in part.split(","))
                                 for part in spec.split("|"))
    return out


@pytest.mark.parametrize("case", ACCEPT, ids=[c.name for c in ACCEPT])
def test_accept(case):
    queries, workload = compile_sql(case.sql)
    W = workload.W.toarray()
    assert W.shape[0] == sum(o.stop - o.start for o in workload.outputs)
    assert set(np.unique(W)) <= {0.0, 1.0}

    cells = case.one("cells")
    assert cells is not None, f"{case.name}: `-- cells:` is required"
    assert workload.n_cells == int(cells), (
        f"cells {workload.n_cells} != {cells}; parts: "
        + "; ".join(f"{p.column}={p.part_units}" for p in workload.partitions))

    parts = case.one("parts")
    if parts is not None:
        got = {p.column: p.part_units for p in workload.partitions}
        assert got == _parse_parts(parts)

    tokens = " ".join(case.directives.get("rows", [])).split()
    assert tokens, f"{case.name}: `-- rows:` is required"
    expected = np.array([[int(ch) for ch in tok.replace("|", "")] for tok in tokens])
    assert expected.shape == W.shape, f"W has shape {W.shape}, fixture {expected.shape}"
    shown = "\n".join("".join(str(int(v)) for v in row) for row in W)
    assert (W == expected).all(), f"W is\n{shown}"

    keys = case.directives.get("keys")
    if keys:
        got_keys = [tuple(k) for o in workload.outputs for k in o.keys]
        assert got_keys == ast.literal_eval(" ".join(keys))
    gids = case.directives.get("gids")
    if gids:
        got_gids = [g for o in workload.outputs for g in (o.grouping_ids or [])]
        assert got_gids == ast.literal_eval(" ".join(gids))


# --------------------------------------------------------------------------- reject


@pytest.mark.parametrize("case", REJECT, ids=[c.name for c in REJECT])
def test_reject(case):
    errors = case.directives.get("error")
    assert errors, f"{case.name}: `-- error:` is required"
    with pytest.raises(ParseError) as info:
        compile_sql(case.sql)
    message = str(info.value)
    for text in errors:
        assert text in message, f"{text!r} not in {message!r}"
    at = case.one("at")
    if at is not None:
        line, col = (int(v) for v in at.split(":"))
        assert (info.value.line, info.value.column) == (line, col), message


def test_every_required_construct_is_covered():
    """The brief's list of constructs that must be rejected, by case name."""
    names = {c.name for c in REJECT}
    required = {
        "drop", "insert", "update", "delete", "stacked_drop_after_select", "copy_to_file",
        "attach", "install", "load", "pragma", "call", "set", "read_csv", "glob",
        "duckdb_tables", "information_schema", "ledger_table", "join", "subquery_in_from",
        "subquery_in_in", "order_by", "limit", "having", "distinct", "count_distinct",
        "sum_without_bounds", "avg_of_expression", "sum_distinct", "min", "select_star", "column_not_declared_in_where", "table_not_protected",
        "two_columns_compared", "arithmetic_in_where", "function_in_where", "equals_null",
        "placeholder", "numeric_condition_splits_a_bin", "categorical_value_not_declared",
        "ordering_on_categorical", "string_compared_to_integer_column", "two_counts",
        "selected_column_not_grouped", "union", "with", "syntax_error_misspelled_keyword",
    }
    assert required <= names, sorted(required - names)

