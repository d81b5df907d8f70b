"""PEP 249 compliance of ``dpsql.interfaces.dbapi``, on the public DB-API 2.0 compliance suite.

The suite is Stuart Bishop's public-domain ``dbapi20.py`` (PyPI: ``dbapi-compliance``
1.15.0; ``pip install dbapi-compliance``). When it is installed, :class:`DpsqlDBAPI20Test`
subclasses its ``DatabaseAPI20Test``. Of its 36 tests, 25 run with the upstream body:
connect, apilevel, threadsafety, paramstyle, Exceptions, ExceptionsAsConnectionAttributes,
commit, rollback, cursor, close, non_idempotent_close, arraysize, Date, Time, Timestamp,
Binary, STRING, BINARY, NUMBER, DATETIME, ROWID, callproc (dpsql has no stored procedures;
callproc is optional and absent, so the upstream test passes without calling it), and
execute, setinputsizes, setoutputsize_basic, whose helpers ``executeDDL1``/``_paraminsert``
are adapted (a qmark SELECT instead of an INSERT). The 11 built on DDL and INSERT
(``create table booze``...) are overridden with dpsql equivalents that check the same PEP
requirement on dpsql's SQL: description, rowcount, executemany, fetchone, fetchmany,
fetchall, mixedfetch, nextset, setoutputsize, None, cursor_isolation.
:class:`DpsqlPEP249Test` restates the 25 from PEP 249 (:class:`_PEP249Base`) and always
runs, so every check holds where the package is absent.

What does NOT apply to a read-only differentially private driver, and why:

* DDL and DML (CREATE/DROP TABLE, INSERT) and the checks after them ("description is None
  and rowcount is -1/0 after a statement that returns no rows", "rowcount == rows
  inserted", fetch* raising after an INSERT): the analyst's SQL is never executed, only
  ``SELECT ... COUNT`` statements are accepted and every one of them returns a result set.
  The overrides check the nearest dpsql behaviour instead: after a refused execute the
  cursor has no result set (description None, fetch* raise).
* Empty result sets (fetchmany/fetchall on "a query that retrieved no rows"): dpsql returns
  every declared group, zeros included, and an ungrouped COUNT returns one row, so no
  query can return zero rows.
* Exact values read back (``'Victoria Bitter'`` round-trips): counts are noisy by design;
  the overrides compare the public parts (group keys, column names, row counts).
* Transaction isolation between cursors (cursor_isolation's insert then select): dpsql has
  no writes and no open transactions (every release is committed by the ledger); the
  override checks that two cursors of one connection keep independent result sets.
* Stored procedures (callproc, and nextset through a procedure): dpsql has none; nextset is
  tested on a multi-statement execute, which dpsql answers as one workload.
* tearDown's DROP TABLE: nothing is created, so the override does nothing.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import unittest

from dpsql.interfaces import dbapi

from ..conftest import ADULT_POLICY, make_adult_db

try:  # the public suite, when installed (PyPI: dbapi-compliance)
    import dbapi20
except ImportError:  # pragma: no cover - exercised where the package is absent
    dbapi20 = None


class _PEP249Base(unittest.TestCase):
    """The upstream tests that apply unchanged, restated from PEP 249 (fallback only)."""

    driver = None
    connect_args: tuple = ()
    connect_kw_args: dict = {}

    def _connect(self):
        return self.driver.connect(*self.connect_args, **self.connect_kw_args)

    def executeDDL1(self, cursor):
        raise NotImplementedError

    def _paraminsert(self, cursor):
        raise NotImplementedError

    def test_connect(self):
        self._connect().close()

    def test_apilevel(self):
        self.assertEqual(self.driver.apilevel, "2.0")

    def test_threadsafety(self):
        self.assertIn(self.driver.threadsafety, (0, 1, 2, 3))

    def test_paramstyle(self):
        self.assertIn(self.driver.paramstyle, ("qmark", "numeric", "named", "format",
                                               "pyformat"))

    def test_Exceptions(self):
        d = self.driver
        self.assertTrue(issubclass(d.Warning, Exception))
        self.assertTrue(issubclass(d.Error, Exception))
        for name in ("InterfaceError", "DatabaseError", "OperationalError", "IntegrityError",
                     "InternalError", "ProgrammingError", "NotSupportedError"):
            self.assertTrue(issubclass(getattr(d, name), d.Error), name)

    def test_ExceptionsAsConnectionAttributes(self):
        con = self._connect()
        for name in ("Warning", "Error", "InterfaceError", "DatabaseError",
                     "OperationalError", "IntegrityError", "InternalError",
                     "ProgrammingError", "NotSupportedError"):
            self.assertIs(getattr(con, name), getattr(self.driver, name))
        con.close()

    def test_commit(self):
        con = self._connect()
        try:
            con.commit()
        finally:
            con.close()

    def test_rollback(self):
        con = self._connect()
        if hasattr(con, "rollback"):
            try:
                con.rollback()
            except self.driver.NotSupportedError:
                pass

    def test_cursor(self):
        con = self._connect()
        try:
            con.cursor()
        finally:
            con.close()

    def test_close(self):
        con = self._connect()
        cur = con.cursor()
        con.close()
        self.assertRaises(self.driver.Error, self.executeDDL1, cur)
        self.assertRaises(self.driver.Error, con.commit)

    def test_non_idempotent_close(self):
        con = self._connect()
        con.close()
        self.assertRaises(self.driver.Error, con.close)

    def test_arraysize(self):
        con = self._connect()
        try:
            self.assertTrue(hasattr(con.cursor(), "arraysize"))
        finally:
            con.close()

    def test_callproc(self):
        con = self._connect()
        try:  # optional in PEP 249; dpsql has no stored procedures and does not define it
            self.assertFalse(hasattr(con.cursor(), "callproc"))
        finally:
            con.close()

    def test_execute(self):
        con = self._connect()
        try:
            self._paraminsert(con.cursor())
        finally:
            con.close()

    def test_setinputsizes(self):
        con = self._connect()
        try:
            cur = con.cursor()
            cur.setinputsizes((25,))
            self._paraminsert(cur)
        finally:
            con.close()

    def test_setoutputsize_basic(self):
        con = self._connect()
        try:
            cur = con.cursor()
            cur.setoutputsize(1000)
            cur.setoutputsize(2000, 0)
            self._paraminsert(cur)
        finally:
            con.close()

    def test_Date(self):
        self.driver.Date(2002, 12, 25)
        self.driver.DateFromTicks(time.mktime((2002, 12, 25, 0, 0, 0, 0, 0, 0)))

    def test_Time(self):
        self.driver.Time(13, 45, 30)
        self.driver.TimeFromTicks(time.mktime((2001, 1, 1, 13, 45, 30, 0, 0, 0)))

    def test_Timestamp(self):
        self.driver.Timestamp(2002, 12, 25, 13, 45, 30)
        self.driver.TimestampFromTicks(time.mktime((2002, 12, 25, 13, 45, 30, 0, 0, 0)))

    def test_Binary(self):
        self.driver.Binary(b"Something")
        self.driver.Binary(b"")

    def test_type_objects(self):
        for name in ("STRING", "BINARY", "NUMBER", "DATETIME", "ROWID"):
            self.assertTrue(hasattr(self.driver, name), name)


RACES = ADULT_POLICY["columns"]["race"]["values"]
BY_RACE = "SELECT race, COUNT(*) FROM adult GROUP BY race"


class _DpsqlOverrides:
    """dpsql's setup and its equivalents of the DDL/INSERT-based upstream tests."""

    driver = dbapi
    connect_kw_args = {"epsilon": 0.01, "delta": 1e-9}

    @classmethod
    def setUpClass(cls):
        cls._dir = tempfile.mkdtemp(prefix="dpsql-dbapi20-")
        path = os.path.join(cls._dir, "adult.duckdb")
        make_adult_db(path, epsilon=1000.0, delta=0.5).close()
        cls.connect_args = (path,)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls._dir, ignore_errors=True)

    def tearDown(self):
        pass  # nothing is ever created by these tests: no DROP TABLE to run

    def executeDDL1(self, cursor):  # used by test_close: any execute must fail when closed
        cursor.execute("SELECT COUNT(*) FROM adult")

    def executeDDL2(self, cursor):
        cursor.execute("SELECT sex, COUNT(*) FROM adult GROUP BY sex")

    def _refused(self, cur):
        with self.assertRaises(self.driver.ProgrammingError):
            cur.execute("SELECT COUNT(*) FROM adult JOIN adult USING (age)")

    # ---------------------------------------------------------------- overrides
    def test_cursor_isolation(self):
        con = self._connect()
        try:
            cur1, cur2 = con.cursor(), con.cursor()
            cur1.execute(BY_RACE)
            cur2.execute("SELECT COUNT(*) FROM adult")
            self.assertEqual(len(cur1.fetchall()), len(RACES))
            self.assertEqual(len(cur2.fetchall()), 1)
        finally:
            con.close()

    def test_description(self):
        con = self._connect()
        try:
            cur = con.cursor()
            self.assertIsNone(cur.description)
            cur.execute("SELECT race AS name, COUNT(*) FROM adult GROUP BY race")
            d = cur.description
            self.assertEqual([c[0] for c in d], ["name", "count", "stderr", "ci_low",
                                                 "ci_high"])
            self.assertTrue(all(len(c) == 7 for c in d))
            self.assertEqual(d[0][1], self.driver.STRING)
            self.assertEqual(d[1][1], self.driver.NUMBER)
            self._refused(cur)
            self.assertIsNone(cur.description, "no result set after a refused execute")
        finally:
            con.close()

    def test_rowcount(self):
        con = self._connect()
        try:
            cur = con.cursor()
            self.assertEqual(cur.rowcount, -1)
            cur.execute(BY_RACE)
            self.assertEqual(cur.rowcount, len(RACES))
            cur.execute("SELECT COUNT(*) FROM adult")
            self.assertEqual(cur.rowcount, 1)
        finally:
            con.close()

    def _paraminsert(self, cur):
        # a qmark parameter, and the upstream troublesome text inside a quoted identifier
        cur.execute('SELECT COUNT(*) AS "thi%s :may ca%(u)se? troub:1e" FROM adult '
                    "WHERE sex = ?", ("Female",))
        self.assertEqual(cur.rowcount, 1)
        self.assertEqual(cur.description[0][0], "thi%s :may ca%(u)se? troub:1e")
        # "Cooper's" is bound as ONE string literal: undeclared, so refused (not executed)
        with self.assertRaises(self.driver.ProgrammingError):
            cur.execute("SELECT COUNT(*) FROM adult WHERE sex = ?", ("Cooper's",))

    def test_executemany(self):
        con = self._connect()
        try:
            cur = con.cursor()
            before = len(con.session.ledger())
            cur.executemany("SELECT COUNT(*) FROM adult WHERE sex = ?",
                            [("Female",), ("Male",)])
            self.assertEqual(len(con.session.ledger()), before + 1, "one release")
            self.assertEqual(cur.rowcount, 1)
            self.assertTrue(cur.nextset())
            self.assertEqual(len(cur.fetchall()), 1)
            self.assertIsNone(cur.nextset())
        finally:
            con.close()

    def test_fetchone(self):
        con = self._connect()
        try:
            cur = con.cursor()
            self.assertRaises(self.driver.Error, cur.fetchone)
            cur.execute("SELECT COUNT(*) FROM adult")
            row = cur.fetchone()
            self.assertEqual(len(row), 4)
            self.assertIsInstance(row[0], float)
            self.assertIsNone(cur.fetchone())
            self.assertEqual(cur.rowcount, 1)
            self._refused(cur)
            self.assertRaises(self.driver.Error, cur.fetchone)
        finally:
            con.close()

    def test_fetchmany(self):
        con = self._connect()
        try:
            cur = con.cursor()
            self.assertRaises(self.driver.Error, cur.fetchmany, 4)
            cur.execute(BY_RACE)
            self.assertEqual(len(cur.fetchmany()), 1, "default arraysize is 1")
            cur.arraysize = 10
            self.assertEqual(len(cur.fetchmany(3)), 3)
            self.assertEqual(len(cur.fetchmany(4)), 1)
            self.assertEqual(cur.fetchmany(4), [])
            cur.arraysize = 3
            cur.execute(BY_RACE)
            self.assertEqual(len(cur.fetchmany()), 3)
            self.assertEqual(len(cur.fetchmany()), 2)
            self.assertEqual(cur.fetchmany(), [])
            cur.arraysize = len(RACES)
            cur.execute(BY_RACE)
            rows = cur.fetchmany()
            self.assertEqual(sorted(r[0] for r in rows), sorted(RACES))
            self.assertEqual(cur.fetchmany(), [])
            self.assertEqual(cur.rowcount, len(RACES))
        finally:
            con.close()

    def test_fetchall(self):
        con = self._connect()
        try:
            cur = con.cursor()
            self.assertRaises(self.driver.Error, cur.fetchall)
            cur.execute(BY_RACE)
            rows = cur.fetchall()
            self.assertEqual(sorted(r[0] for r in rows), sorted(RACES))
            self.assertEqual(cur.fetchall(), [])
            self.assertEqual(cur.rowcount, len(RACES))
            self._refused(cur)
            self.assertRaises(self.driver.Error, cur.fetchall)
        finally:
            con.close()

    def test_mixedfetch(self):
        con = self._connect()
        try:
            cur = con.cursor()
            cur.execute(BY_RACE)
            r1, r23, r4, r5 = cur.fetchone(), cur.fetchmany(2), cur.fetchone(), cur.fetchall()
            self.assertEqual((len(r23), len(r5)), (2, 1))
            self.assertEqual(sorted([r1[0], r23[0][0], r23[1][0], r4[0], r5[0][0]]),
                             sorted(RACES))
        finally:
            con.close()

    def test_nextset(self):
        con = self._connect()
        try:
            cur = con.cursor()
            self.assertRaises(self.driver.Error, cur.nextset)
            cur.execute("SELECT COUNT(*) FROM adult; " + BY_RACE)
            self.assertEqual(len(cur.fetchall()), 1)
            self.assertTrue(cur.nextset())
            self.assertEqual(len(cur.fetchall()), len(RACES))
            self.assertIsNone(cur.nextset(), "no more result sets")
        finally:
            con.close()

    def test_setoutputsize(self):
        con = self._connect()
        try:  # a no-op for dpsql (no LONG/BLOB columns): results are unchanged
            cur = con.cursor()
            cur.setoutputsize(1, 0)
            cur.execute(BY_RACE)
            self.assertEqual(len(cur.fetchall()), len(RACES))
        finally:
            con.close()

    def test_None(self):
        con = self._connect()
        try:  # a rolled-up key of a CUBE is SQL NULL
            cur = con.cursor()
            cur.execute("SELECT sex, COUNT(*) FROM adult GROUP BY CUBE(sex)")
            keys = [r[0] for r in cur.fetchall()]
            self.assertEqual(keys.count(None), 1, "NULL is returned as None")
        finally:
            con.close()


class DpsqlPEP249Test(_DpsqlOverrides, _PEP249Base):
    """The suite restated from PEP 249: always runs."""


if dbapi20 is not None:
    class DpsqlDBAPI20Test(_DpsqlOverrides, dbapi20.DatabaseAPI20Test):
        """The public dbapi20 suite itself, with the overrides above."""
