"""Each analyst's namespace of result tables (dpsql.interfaces.server.names), without a
server: every spelling of a CREATE TABLE target lands in the sender's namespace, other
schemas and reserved names are refused, anything else is left as it was."""

from __future__ import annotations

import pytest

from dpsql import errors as dp
from dpsql.interfaces.server import names

PROTECTED = {"adult"}
Q = " AS SELECT count(*) FROM adult"


@pytest.mark.parametrize("target", [
    "mine", "MINE", '"mine"', "main.mine", "public.mine", 'main . "mine"', "bob.mine",
    "/* c */ mine",
])
def test_every_spelling_lands_in_the_senders_namespace(target):
    for head in ("CREATE TABLE ", "create or replace table ", "CREATE OR REPLACE TABLE "):
        out = names.rewrite(head + target + Q + "; -- done", "Bob", PROTECTED)
        assert out.startswith(head) and out.endswith(Q + "; -- done")
        assert out[len(head):-len(Q + "; -- done")].strip().lower() in (
            '"@bob/mine"', '/* c */ "@bob/mine"')


@pytest.mark.parametrize("sql, error", [
    ("CREATE TABLE alice.mine" + Q, dp.AccessDenied),
    ('CREATE TABLE "alice"."mine"' + Q, dp.AccessDenied),
    ("CREATE TABLE db.main.mine" + Q, dp.AccessDenied),
    ('CREATE TABLE "@alice/mine"' + Q, dp.UnsupportedQueryError),
    ("CREATE TABLE dp_r12_q3" + Q, dp.UnsupportedQueryError),
    ("CREATE TABLE adult" + Q, dp.UnsupportedQueryError),
    ("CREATE TABLE dpsql_budget" + Q, dp.UnsupportedQueryError),
    ("CREATE TABLE pg_class" + Q, dp.UnsupportedQueryError),
])
def test_other_schemas_and_reserved_names_are_refused(sql, error):
    with pytest.raises(error):
        names.rewrite(sql, "bob", PROTECTED)


@pytest.mark.parametrize("sql", [
    "SELECT count(*) FROM adult", "CREATE VIEW v AS SELECT 1", "SELEC oops", "",
    "DROP TABLE mine", "CREATE TABLE t (a INT)",
])
def test_anything_else_is_left_as_it_was(sql):
    assert names.rewrite(sql, "bob", PROTECTED) in (sql, sql.replace("t (", '"@bob/t" ('))


def test_names_round_trip_and_user_names_are_checked():
    assert names.physical("Bob", "Mine") == "@bob/Mine"
    assert names.logical("bob", "@BOB/Mine") == "Mine"
    assert names.logical("bob", "dp_r1_q1") == "dp_r1_q1"       # unnamed: as it is
    assert names.owner("@bob/x/y") == "bob" and names.owner("x") is None
    assert names.unprefixed("bob", "table '@bob/mine' already exists") == \
        "table 'mine' already exists"
    for good in ("alice", "a.b-c@example.org", "user_1"):
        names.check_user_name(good)
    for bad in ("", "a/b", "main", "PG_x", "duckdb_y", "x" * 64, "tab\there", "-x"):
        with pytest.raises(dp.DpsqlError):
            names.check_user_name(bad)
