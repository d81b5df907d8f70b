-- A reporting job's batch: every statement is answered together, as one workload.
-- Run with:  dpsql run census.duckdb examples/weekly_report.sql --epsilon 0.3 --delta 1e-6

CREATE OR REPLACE TABLE report_hours AS
SELECT sex, hours_per_week, COUNT(*) AS people FROM adult GROUP BY sex, hours_per_week;

CREATE OR REPLACE TABLE report_high_income AS
SELECT race, COUNT(*) AS people FROM adult WHERE income = '>50K' GROUP BY race;

SELECT COUNT(*) AS seniors FROM adult WHERE age >= 65;
