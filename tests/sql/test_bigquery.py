"""BigQuery's differential privacy form (issue 20 item 5): ``SELECT WITH DIFFERENTIAL_PRIVACY
OPTIONS (...)`` read through the one settings declaration, ``ANON_* (... CLAMPED BETWEEN lo AND
hi)``, conflicting settings refused, the policy's privacy unit checked. No data."""

from __future__ import annotations

from fractions import Fraction

import pytest

from dpsql.errors import ParseError, PrivacyParameterError, UnsupportedQueryError
from dpsql.policy.policy import load_policy
from dpsql.request.value import Request
from dpsql.sql import bigquery
from dpsql.sql.parse import parse_batch

from ..conftest import ADULT_POLICY

POLICY = load_policy(ADULT_POLICY, "adult")["adult"]


def parse(sql):
    return parse_batch(sql, lambda name, node: POLICY)


def test_bigquery_spelling_is_dpsql_clamp():
    a = parse("SELECT sex, ANON_SUM(hours_per_week CLAMPED BETWEEN 0 AND 60) FROM adult "
              "GROUP BY sex")[0]
    b = parse("SELECT sex, SUM(CLAMP(hours_per_week, 0, 60)) FROM adult GROUP BY sex")[0]
    assert (a.aggregate, a.value, a.key_columns, a.grouping_sets) == \
        (b.aggregate, b.value, b.key_columns, b.grouping_sets)


# --------------------------------------------------------------------------- BigQuery's form

DP = "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1, delta = 1e-6{extra}) "


def test_the_clause_is_blanked_in_place():
    text = (DP.format(extra=", privacy_unit_column = id") + "sex,\n ANON_SUM(age CLAMPED "
            "BETWEEN 0 AND 50) FROM adult GROUP BY sex")
    out = bigquery.rewrite(text)
    assert len(out) == len(text) and out.count("\n") == text.count("\n")
    assert "DIFFERENTIAL_PRIVACY" not in out and "CLAMPED" not in out
    assert "ANON_SUM(age" in out and out.index("FROM") == text.index("FROM")
    assert [o[1:3] for o in bigquery.options(text)] == [
        ("epsilon", "1"), ("delta", "1e-6"), ("privacy_unit_column", "id")]


def test_positions_of_errors_are_kept():
    text = DP.format(extra="") + "sex, SUM(nope) FROM adult GROUP BY sex"
    with pytest.raises(UnsupportedQueryError) as info:
        parse(text)
    assert info.value.column == text.index("nope") + 1


def test_options_become_request_settings():
    r = Request(DP.format(extra=", strategy = 'identity'") + "COUNT(*) FROM adult")
    assert (r.epsilon, r.delta, r.strategy) == (1, Fraction(1, 10 ** 6), "identity")


@pytest.mark.parametrize("kwargs, sql, words", [
    ({}, DP.format(extra="") + "COUNT(*) FROM adult; " + DP.format(extra="").replace(
        "epsilon = 1", "epsilon = 2") + "COUNT(*) FROM adult",
     "conflicting settings in one batch: statement 1 gives epsilon = 1, statement 2 epsilon"),
    ({"epsilon": 0.5}, DP.format(extra="") + "COUNT(*) FROM adult",
     "conflicting settings: statement 1 gives epsilon = 1 in WITH DIFFERENTIAL_PRIVACY"),
    ({}, DP.format(extra=", colour = 3") + "COUNT(*) FROM adult", "unknown option 'colour'"),
    ({}, DP.format(extra="").replace("1e-6", "2") + "COUNT(*) FROM adult", "delta"),
])
def test_conflicting_or_unknown_options_are_refused(kwargs, sql, words):
    with pytest.raises(PrivacyParameterError) as info:
        Request(sql, **kwargs)
    assert words in str(info.value) and "\n" not in str(info.value)


def test_the_same_setting_twice_with_the_same_value_is_one_setting():
    sql = DP.format(extra="") + "COUNT(*) FROM adult;\n" + DP.format(extra="") + \
        "sex, COUNT(*) FROM adult GROUP BY sex"
    assert Request(sql, epsilon=1).epsilon == 1


@pytest.mark.parametrize("extra, words", [
    (", privacy_unit_column = id", "declares no privacy unit"),
    (", max_groups_contributed = 2", "max_groups_contributed is not supported"),
])
def test_policy_options_are_checked_against_the_policy(extra, words):
    with pytest.raises(ParseError) as info:
        bigquery.check_unit(DP.format(extra=extra) + "COUNT(*) FROM adult", POLICY)
    assert words in str(info.value)


# --------------------------------------------------------------------------- end to end

BQ_BATCH = ("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 0.5, delta = 1e-6) sex, "
            "ANON_SUM(hours_per_week CLAMPED BETWEEN 0 AND 60) AS hours FROM adult "
            "GROUP BY sex;\n"
            "SELECT race, ANON_AVG(age CLAMPED BETWEEN 17 AND 90) AS mean_age FROM adult "
            "GROUP BY race;\nSELECT income, ANON_COUNT(*) AS n FROM adult GROUP BY income")


def test_a_bigquery_batch_runs_through_the_dbapi(tmp_path):
    from dpsql import dbapi

    from ..conftest import make_adult_db

    path = str(tmp_path / "bq.duckdb")
    make_adult_db(path, epsilon=2).close()
    # the connection's settings are defaults: the statement's OPTIONS take effect
    with dbapi.connect(path, epsilon=0.1, delta=1e-5) as conn:
        cur = conn.cursor()
        cur.execute(BQ_BATCH)
        assert [d[0] for d in cur.description][:2] == ["sex", "hours"]
        assert len(cur.fetchall()) == 2
        two = BQ_BATCH.replace("ANON_AVG", "ANON_AVG", 1).replace(
            "SELECT race", "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 0.25) race")
        with pytest.raises(dbapi.ProgrammingError, match="conflicting settings in one batch"):
            cur.execute(two)
    session = __import__("dpsql").connect(path)
    (entry,) = session.ledger()
    assert entry["epsilon"] == 0.5 and entry["delta"] == 1e-6
    assert entry["strategy"].startswith("joint(COUNT") and "hours_per_week[0, 60]" in \
        entry["strategy"]
    session.close()


def test_a_script_keeps_the_options_and_refuses_a_conflicting_set(tmp_path, capsys):
    from dpsql.interfaces import cli

    from ..conftest import make_adult_db

    path = str(tmp_path / "bq.duckdb")
    make_adult_db(path, epsilon=2).close()
    script = tmp_path / "bq.sql"
    script.write_text("SET dpsql.delta = 1e-6;\n" + BQ_BATCH + ";\n")
    assert cli.main(["run", path, str(script)]) == 0
    assert "released as release" in capsys.readouterr().out
    script.write_text("SET dpsql.epsilon = 0.25;\n" + BQ_BATCH + ";\n")
    assert cli.main(["explain", path, str(script)]) == 65
    assert "conflicting settings" in capsys.readouterr().err
    # a SET equal to the command line's default is still an explicit setting
    assert cli.main(["explain", path, str(script), "--epsilon", "0.25"]) == 65
    assert "conflicting settings" in capsys.readouterr().err
    # the command line's default alone yields to the statement's OPTIONS
    script.write_text(BQ_BATCH + ";\n")
    assert cli.main(["explain", path, str(script), "--epsilon", "0.25", "--delta",
                     "1e-6"]) == 0
    assert "epsilon=0.5" in capsys.readouterr().out
