-- Ranges and predicates on the Adult census extract: working hours, schooling, sector and
-- occupation. Two workloads with their own budgets: the first (hours and schooling) gets
-- more epsilon than the second (sector and occupation).
-- Run:   dpsql run census.duckdb sql/ranges_and_predicates.sql
--
-- Ranges on hours_per_week must follow the policy's bin edges (0, 20, 35, 40, 45, 60, 100):
-- `hours_per_week >= 45` is answerable, `hours_per_week > 50` is refused.

SET dpsql.release = 'ranges-and-predicates-2026-11';
SET dpsql.delta = 1e-6;

-- workload 1: working hours and years of schooling
SET dpsql.epsilon = 0.3;

CREATE OR REPLACE TABLE hours_bands AS
SELECT hours_per_week, income, COUNT(*) AS people FROM adult GROUP BY hours_per_week, income;
CREATE OR REPLACE TABLE part_time AS
SELECT sex, COUNT(*) AS people FROM adult WHERE hours_per_week < 35 GROUP BY sex;
CREATE OR REPLACE TABLE long_hours_high_income AS
SELECT COUNT(*) AS people FROM adult WHERE hours_per_week >= 45 AND income = '>50K';
CREATE OR REPLACE TABLE schooling_12_or_less AS
SELECT income, COUNT(*) AS people FROM adult WHERE education_num <= 12 GROUP BY income;
CREATE OR REPLACE TABLE schooling_13_plus_full_time AS
SELECT COUNT(*) AS people FROM adult
WHERE education_num >= 13 AND hours_per_week >= 35 AND hours_per_week < 60;

-- workload 2: sector, occupation and marital status (a SET after queries starts it)
SET dpsql.epsilon = 0.2;

CREATE OR REPLACE TABLE public_sector AS
SELECT sex, COUNT(*) AS people FROM adult
WHERE workclass IN ('Federal-gov', 'State-gov', 'Local-gov') GROUP BY sex;
CREATE OR REPLACE TABLE not_private_sector AS          -- NOT IN keeps the undeclared '?' rows
SELECT COUNT(*) AS people FROM adult WHERE workclass NOT IN ('Private');
CREATE OR REPLACE TABLE managers_professionals_degree AS
SELECT income, COUNT(*) AS people FROM adult
WHERE occupation IN ('Exec-managerial', 'Prof-specialty')
  AND education IN ('Bachelors', 'Masters', 'Prof-school', 'Doctorate')
GROUP BY income;
CREATE OR REPLACE TABLE young_ever_married AS
SELECT COUNT(*) AS people FROM adult
WHERE age < 30 AND marital_status <> 'Never-married';
CREATE OR REPLACE TABLE older_or_self_employed AS
SELECT COUNT(*) AS people FROM adult
WHERE age >= 60 OR workclass IN ('Self-emp-inc', 'Self-emp-not-inc');
