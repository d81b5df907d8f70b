"""Policies: the declared public domains and the privacy budget of each protected table.

A policy is declared by the data owner, in TOML or as a Python dict of the same shape::

    [tables.adult]
    epsilon = 1.0
    delta = 1e-6
    [tables.adult.columns]
    age = { type = "integer", min = 17, max = 90 }
    sex = { type = "categorical", values = ["Female", "Male"] }
    hours_per_week = { type = "numeric", min = 0, max = 100, edges = [0, 20, 40, 60, 100] }

An optional ``rows = 32561`` declares the table's row count public (the data owner's
decision: under add/remove-one-row neighbours the count is otherwise private); MWEM then
uses it instead of spending budget on estimating it. An optional ``[tables.<t>.metric]``
section declares a d_X (metric privacy) model with its own budget (:mod:`dpsql.policy.record_metric`).
Optional ``[tables.<t>.public.<name>]`` sections declare public lookup tables a query may
join on their key (:mod:`dpsql.policy.public`).
An optional ``zcdp_delta`` is the share of ``delta`` reserved for the zCDP accountant
(:mod:`dpsql.noise.composition`, docs/accounting.md): basic composition may then charge
``delta - zcdp_delta``. It defaults to half of ``delta``; ``0`` means basic composition alone.
Policies saved before this setting existed read back as ``0`` (never more budget than the
rule they were protected under).
An optional ``source`` says where the rows live (a Spark table or files,
:mod:`dpsql.policy.source`); by default the DuckDB table of the policy's name.
User-level privacy: ``privacy_unit = "person_id"`` with ``max_rows_per_unit = k`` makes the
neighbouring relation "add or remove one unit" (every row of one person): the engine keeps at
most ``k`` rows per unit, chosen by a keyed hash (:mod:`dpsql.engines.duckdb`, the key drawn
at ``protect`` and kept out of the policy's JSON, :func:`dpsql.store.ledger.save_policy`), and
every sensitivity is multiplied by ``k`` (:attr:`TablePolicy.contribution`; derivation in
:mod:`dpsql.workload.values`). A row whose unit is NULL is a unit of its own.
``max_groups_per_unit`` is refused: a unit's rows bound its groups already (``k`` rows fall
in at most ``k`` groups), and a separate group cap would need a second, per-query selection.
Domains are never inferred from data. Budgets are kept as exact fractions (floats are read through
their shortest decimal form, so ``0.1`` is exactly one tenth).
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, Mapping

from dpsql.noise.accounting import fraction_from_text, fraction_to_text, to_exact
from dpsql.policy.public import public_tables
from dpsql.policy.source import Source, source_from_spec
from dpsql.workload.domain import Domain, domain_from_spec
from dpsql.workload import limits as planning
from dpsql.errors import PolicyError, PrivacyParameterError, read_input_file

_TABLE_FIELDS = {"epsilon", "delta", "columns", "rows", "metric", "zcdp_delta", "public",
                 "source", "privacy_unit", "max_rows_per_unit", "max_groups_per_unit"}

#: the largest ``max_rows_per_unit``: every sensitivity is multiplied by it, so a larger one
#: only buys noise (a unit with more rows than this is better summarised before protecting)
MAX_ROWS_PER_UNIT = 1_000_000


def _is_identifier(name: str) -> bool:
    return isinstance(name, str) and name.isidentifier() and name.isascii()


@dataclass(frozen=True)
class TablePolicy:
    """The frozen, validated policy of one protected table."""

    table: str
    epsilon: Fraction
    delta: Fraction
    columns: tuple  # tuple[(name, Domain)], in declaration order
    rows: int | None = None  # the row count, when the owner declares it public (MWEM's n)
    metric: object = None    # dpsql.policy.record_metric.MetricModel: the d_X model and its own budget
    #: share of ``delta`` reserved for the zCDP accountant, fixed when the table is protected
    #: (0: basic composition alone, the value for policies saved before the setting existed)
    zcdp_delta: Fraction = Fraction(0)
    #: where the rows live (:mod:`dpsql.policy.source`): the DuckDB table by default
    source: Source = Source()
    #: user-level privacy: the column naming each row's unit (a person), and how many rows
    #: of one unit are kept at most (None, None: row-level privacy)
    privacy_unit: str | None = None
    max_rows_per_unit: int | None = None
    #: public lookup tables a query may JOIN on their key (:mod:`dpsql.policy.public`)
    public: tuple = ()

    def public_table(self, name: str):
        """The declared public table ``name`` (a PublicTable), or None."""
        return next((p for p in self.public if p.name == name.lower()), None)

    @property
    def contribution(self) -> int:
        """How many rows one unit of privacy adds or removes at most: ``max_rows_per_unit``
        under user-level privacy, else 1 (a row). Every sensitivity is multiplied by it."""
        return self.max_rows_per_unit if self.privacy_unit is not None else 1

    @property
    def budget(self):
        """The accountant's view of this budget (:class:`dpsql.noise.composition.Budget`)."""
        from dpsql.noise.composition import Budget

        return Budget(self.epsilon, self.delta, self.zcdp_delta)

    def column(self, name: str) -> Domain:
        for col, dom in self.columns:
            if col == name.lower():
                return dom
        raise KeyError(name)

    @property
    def column_names(self) -> list[str]:
        return [c for c, _ in self.columns]

    def to_json(self) -> str:
        doc = {
            "table": self.table,
            "epsilon": fraction_to_text(self.epsilon),
            "delta": fraction_to_text(self.delta),
            "columns": {c: d.describe() for c, d in self.columns},
        }
        if self.rows is not None:
            doc["rows"] = self.rows
        if self.metric is not None:
            doc["metric"] = self.metric.describe()
        doc["zcdp_delta"] = fraction_to_text(self.zcdp_delta)
        if self.source.spark:      # a DuckDB table's policy reads as it always did
            doc["source"] = self.source.describe()
        if self.public:
            doc["public"] = {p.name: p.describe() for p in self.public}
        if self.privacy_unit is not None:
            doc["privacy_unit"] = self.privacy_unit
            doc["max_rows_per_unit"] = self.max_rows_per_unit
        return json.dumps(doc)

    @classmethod
    def from_json(cls, text: str) -> "TablePolicy":
        raw = json.loads(text)
        cols = tuple((c, domain_from_spec(raw["table"], c, spec))
                     for c, spec in raw["columns"].items())
        metric = None
        if raw.get("metric") is not None:
            from dpsql.policy.record_metric import MetricModel

            metric = MetricModel.from_dict(raw["metric"], table=raw["table"],
                                           domains=dict(cols))
        # a policy saved before zcdp_delta existed was accounted by the old rule; it reads as
        # basic composition alone, which never leaves more budget than that rule did
        zcdp = raw.get("zcdp_delta")
        return cls(raw["table"], fraction_from_text(raw["epsilon"]),
                   fraction_from_text(raw["delta"]), cols, rows=raw.get("rows"), metric=metric,
                   zcdp_delta=Fraction(0) if zcdp is None else fraction_from_text(zcdp),
                   public=public_tables(raw["table"], raw.get("public"), dict(cols)),
                   privacy_unit=raw.get("privacy_unit"),
                   max_rows_per_unit=raw.get("max_rows_per_unit"),
                   source=source_from_spec(raw["table"], raw.get("source")))


def _privacy_unit(table: str, spec: Mapping[str, Any]) -> tuple[str | None, int | None]:
    """(privacy_unit, max_rows_per_unit) of a policy entry: both or neither."""
    if spec.get("max_groups_per_unit") is not None:
        raise PolicyError(
            f"policy for table {table!r}: max_groups_per_unit is not supported: a unit's rows "
            "are capped by max_rows_per_unit, which bounds its groups too (k rows fall in at "
            "most k groups); drop max_groups_per_unit and declare max_rows_per_unit")
    unit, k = spec.get("privacy_unit"), spec.get("max_rows_per_unit")
    if unit is None and k is None:
        return None, None
    if unit is None or k is None:
        raise PolicyError(
            f"policy for table {table!r}: user-level privacy needs both privacy_unit (the "
            "column naming each row's person) and max_rows_per_unit (how many of a person's "
            "rows are kept at most); declare both, or neither for row-level privacy")
    if not _is_identifier(unit):
        raise PolicyError(f"policy for table {table!r}: privacy_unit must name a column "
                          f"with a plain SQL identifier, got {unit!r}")
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_ROWS_PER_UNIT:
        raise PolicyError(
            f"policy for table {table!r}: max_rows_per_unit must be an integer from 1 to "
            f"{MAX_ROWS_PER_UNIT:,} (every sensitivity is multiplied by it), got {k!r}")
    return unit.lower(), k


def _zcdp_delta(table: str, spec: Mapping[str, Any], delta: Fraction) -> Fraction:
    """The share of ``delta`` reserved for the zCDP accountant: declared, or half of ``delta``
    (the documented default, docs/accounting.md)."""
    if spec.get("zcdp_delta") is None:
        return delta / 2
    try:
        zcdp_delta = to_exact(spec["zcdp_delta"], "zcdp_delta")
    except PrivacyParameterError as exc:
        raise PolicyError(f"policy for table {table!r}: {exc}") from None
    if not 0 <= zcdp_delta <= delta:
        raise PolicyError(f"policy for table {table!r}: zcdp_delta (the share of delta "
                          f"reserved for the zCDP accountant) must be in [0, delta], got "
                          f"{float(zcdp_delta)!r}")
    return zcdp_delta


def table_policy_from_spec(table: str, spec: Mapping[str, Any]) -> TablePolicy:
    """Validate one table's policy entry (``epsilon``, ``delta``, ``columns``)."""
    if not _is_identifier(table):
        raise PolicyError(
            f"table name {table!r} must be a plain SQL identifier (letters, digits, _)"
        )
    if not isinstance(spec, Mapping):
        raise PolicyError(f"policy for table {table!r} must be a table/dict")
    unknown = set(spec) - _TABLE_FIELDS
    if unknown:
        raise PolicyError(
            f"policy for table {table!r}: unknown field(s) {sorted(unknown)} "
            f"(allowed: {sorted(_TABLE_FIELDS)})"
        )
    for need in ("epsilon", "delta", "columns"):
        if need not in spec:
            raise PolicyError(f"policy for table {table!r} must declare `{need}`")
    try:
        epsilon = to_exact(spec["epsilon"], "epsilon")
        delta = to_exact(spec["delta"], "delta")
    except PrivacyParameterError as exc:
        raise PolicyError(f"policy for table {table!r}: {exc}") from None
    if epsilon <= 0:
        raise PolicyError(f"policy for table {table!r}: epsilon budget must be > 0, got "
                          f"{float(epsilon)!r}")
    if not (0 <= delta < 1):
        raise PolicyError(f"policy for table {table!r}: delta budget must be in [0, 1), got "
                          f"{float(delta)!r}")
    zcdp_delta = _zcdp_delta(table, spec, delta)
    rows = spec.get("rows")
    if rows is not None and (isinstance(rows, bool) or not isinstance(rows, int) or rows < 0):
        raise PolicyError(f"policy for table {table!r}: `rows` (the row count, declared "
                          f"public) must be an integer >= 0, got {rows!r}")
    columns = spec["columns"]
    if not isinstance(columns, Mapping) or len(columns) == 0:
        raise PolicyError(f"policy for table {table!r} must declare at least one column")
    cols = []
    seen = set()
    for name, col_spec in columns.items():
        if not _is_identifier(name):
            raise PolicyError(
                f"table {table!r}: column name {name!r} must be a plain SQL identifier"
            )
        if name.lower() in seen:
            raise PolicyError(f"table {table!r}: column {name!r} declared twice")
        seen.add(name.lower())
        cols.append((name.lower(), _usable(table, name, domain_from_spec(table, name,
                                                                         col_spec))))
    metric = None
    if spec.get("metric") is not None:
        from dpsql.policy.record_metric import MetricModel

        metric = MetricModel.from_dict(spec["metric"], table=table, domains=dict(cols))
    unit, k = _privacy_unit(table, spec)
    return TablePolicy(table.lower(), epsilon, delta, tuple(cols), rows=rows, metric=metric,
                       zcdp_delta=zcdp_delta, privacy_unit=unit, max_rows_per_unit=k,
                       public=public_tables(table, spec.get("public"), dict(cols)),
                       source=source_from_spec(table, spec.get("source")))


def _usable(table: str, name: str, domain):
    """A domain some request could use: a GROUP BY over the column alone must compile
    within the planning limits (:func:`dpsql.workload.limits.max_column_units`)."""
    most = planning.max_column_units()
    if domain.n_units > most:
        limits = planning.current()
        raise PolicyError(
            f"policy for table {table!r}: column {name!r} has {domain.n_units:,} units "
            f"(declared values or steps, plus other and NULL); no request could use it within "
            f"{limits.describe()}: grouping by it alone needs about "
            f"{planning.compile_seconds(domain.n_units, domain.n_units):.3g} s to compile "
            f"(at most {most:,} units per column); nothing was stored; declare fewer values, "
            "or coarser bins (a numeric column with edges, an integer column with a larger "
            "step)")
    return domain


def load_policy(source: str | Path | Mapping[str, Any], table: str | None = None) -> dict:
    """Read a policy from a TOML path or a dict; returns ``{table: TablePolicy}``.

    The dict may be the whole document (``{"tables": {name: {...}}}``) or, when ``table`` is
    given, that one table's entry.
    """
    if isinstance(source, (str, Path)):
        path = Path(source)
        text = read_input_file(str(path), "policy file")   # missing, directory, not UTF-8
        try:
            doc: Mapping[str, Any] = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise PolicyError(f"policy file {str(path)!r} is not valid TOML: {exc}; fix "
                              "the TOML syntax there") from None
    elif isinstance(source, Mapping):
        doc = source
    else:
        raise PolicyError("a policy must be a path to a TOML file or a dict")
    if "tables" in doc:
        unknown = set(doc) - {"tables"}
        if unknown:
            raise PolicyError(f"policy: unknown top-level field(s) {sorted(unknown)}")
        tables = doc["tables"]
        if not isinstance(tables, Mapping):
            raise PolicyError(f"policy: `tables` must hold one [tables.<name>] section per "
                              f"table, got {type(tables).__name__}")
        if not tables:
            raise PolicyError("policy: `tables` must declare at least one table")
        out = {str(name).lower(): table_policy_from_spec(name, spec)   # checks the name
               for name, spec in tables.items()}
        if table is not None:
            if table.lower() not in out:
                raise PolicyError(
                    f"policy declares no table {table!r} (it declares {sorted(out)})"
                )
            return {table.lower(): out[table.lower()]}
        return out
    if table is None:
        raise PolicyError("policy has no [tables.<name>] section; name the table")
    return {table.lower(): table_policy_from_spec(table, doc)}
