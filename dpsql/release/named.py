"""Named releases asked again: the recorded answers, or a refusal. Never new noise.

"The same request" is the same SQL and the same parameters as asked (ε, δ, strategy,
calibration, model, post-processing flags), recorded with the charge
(:func:`dpsql.release.support.request_matches`)."""

from __future__ import annotations

import json
import math
from fractions import Fraction

from dpsql.errors import DpsqlError
from dpsql.noise.accounting import fraction_from_text
from dpsql.release.mechanism import Ask
from dpsql.release.support import request_matches
from dpsql.store import database as engine
from dpsql.store import ledger
from dpsql.store.results import Release, ResultTable


def recorded_answer(con, entry: dict, ask: Ask) -> Release:
    """The recorded release ``entry`` under ``ask.name``, if ``ask`` is the same request."""
    if ask.objective is not None:
        return recorded_target(con, entry, ask.text, ask.delta, ask.strategy,
                               ask.calibration, ask.model, ask.flags, ask.objective)
    return recorded(con, entry, ask.text, ask.epsilon, ask.delta, ask.strategy,
                    ask.calibration, ask.model, ask.flags)


def recorded(con, entry: dict, text: str, eps, dlt, strategy: str, calibration: str,
             model: str = "dp", extra: dict | None = None) -> Release:
    """The recorded answers of a named release asked again with these parameters."""
    name = entry["release_name"]
    same = request_matches(entry, text, eps, dlt, strategy, calibration, model, extra)
    if not same:
        raise DpsqlError(
            f"release name {name!r} is already used (release {entry['release_id']}) for a "
            "different batch or different parameters; choose another name")
    if entry["status"] != "released":
        raise DpsqlError(
            f"release {name!r} was charged but its results were never written (it was "
            "interrupted); its budget stays spent and it cannot be re-noised for free; "
            "choose another name to release again")
    results = []
    for table in entry["result_tables"]:
        owner = ledger.table_owner(con, table)
        if not engine.table_exists(con, table) or owner != entry["release_id"]:
            later = (f" (release {owner} has replaced it)" if owner is not None
                     and owner != entry["release_id"] else "")
            raise DpsqlError(
                f"release {name!r} is recorded, but its result table {table!r} no longer "
                f"holds its answers{later}; they cannot be returned again without a new "
                "charge")
        with engine.engine_errors(f"reading result table {table!r}"):
            cur = con.execute(f"SELECT * FROM main.{engine.quote_ident(table)}")
            cols = tuple(d[0] for d in cur.description)
            results.append(ResultTable(table, cols, cur.fetchall()))
    return Release(entry["release_id"], entry["table_name"], list(entry["result_tables"]),
                   entry["epsilon"], entry["delta"], entry["strategy"], entry["sigma"],
                   entry["expected_rmse"], results, entry["private"], name=name,
                   reused=True)


def recorded_target(con, entry: dict, text: str, dlt, strategy: str, calibration: str,
                    model: str, flags: dict, objective) -> Release:
    """A named accuracy-first release asked again: the same request at the ε recorded
    then (the ε a target needs changes once past releases can be combined), returned
    only if the recorded answers meet the target. Never new noise."""
    request = json.loads(entry.get("request") or "{}")
    eps = (fraction_from_text(request["epsilon"]) if "epsilon" in request
           else Fraction(repr(entry["epsilon"])))
    release = recorded(con, entry, text, eps, dlt, strategy, calibration, model, flags)
    if objective[0] == "rmse":
        achieved = release.expected_rmse
    else:
        achieved = max((float(row[list(t.columns).index("stderr")]) for t in
                        release.results for row in t.rows
                        if "stderr" in t.columns), default=math.nan)
    if not achieved <= objective[1] * (1 + 1e-9):
        raise DpsqlError(
            f"release name {entry['release_name']!r} is recorded with an expected "
            f"{objective[0].replace('_', ' ')} of {achieved:g}, which does not meet "
            f"{objective[1]:g}; choose another name to release again")
    return release
