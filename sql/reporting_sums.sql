-- A reporting batch on the Adult census extract: 20 COUNT, 20 SUM(hours_per_week),
-- 10 AVG(age) and 5 quantile statements by group, released as ONE workload (issue 20): one
-- charge, a measurement block per data vector (the counts, with the quantiles' CDF counts;
-- the clamped sums of hours_per_week, of age), the budget split between them for the
-- batch's total expected error. SUM and AVG clamp each row to the declared bounds
-- (hours_per_week: [0, 100], age: [17, 90]); a quantile is read from its noisy CDF
-- (docs/sql.md#quantiles).
-- Committed before benchmarks/sql_surface.py measured it. Run:
--     dpsql run census.duckdb sql/reporting_sums.sql
-- Re-running returns the recorded answers and charges nothing.

SET dpsql.release = 'reporting-sums-2026-11';
SET dpsql.epsilon = 0.5;
SET dpsql.delta = 1e-6;

-- ---------------------------------------------------------------- 20 COUNT
CREATE OR REPLACE TABLE report_count_01 AS
SELECT sex, COUNT(*) AS people
FROM adult
GROUP BY sex;
CREATE OR REPLACE TABLE report_count_02 AS
SELECT race, COUNT(*) AS people
FROM adult
GROUP BY race;
CREATE OR REPLACE TABLE report_count_03 AS
SELECT income, COUNT(*) AS people
FROM adult
GROUP BY income;
CREATE OR REPLACE TABLE report_count_04 AS
SELECT sex, income, COUNT(*) AS people
FROM adult
GROUP BY sex, income;
CREATE OR REPLACE TABLE report_count_05 AS
SELECT race, income, COUNT(*) AS people
FROM adult
GROUP BY race, income;
CREATE OR REPLACE TABLE report_count_06 AS
SELECT COUNT(*) AS people
FROM adult;
CREATE OR REPLACE TABLE report_count_07 AS
SELECT COUNT(*) AS people
FROM adult
WHERE age < 25;
CREATE OR REPLACE TABLE report_count_08 AS
SELECT COUNT(*) AS people
FROM adult
WHERE age BETWEEN 25 AND 44;
CREATE OR REPLACE TABLE report_count_09 AS
SELECT COUNT(*) AS people
FROM adult
WHERE age BETWEEN 45 AND 64;
CREATE OR REPLACE TABLE report_count_10 AS
SELECT COUNT(*) AS people
FROM adult
WHERE age >= 65;
CREATE OR REPLACE TABLE report_count_11 AS
SELECT sex, COUNT(*) AS people
FROM adult
WHERE income = '>50K'
GROUP BY sex;
CREATE OR REPLACE TABLE report_count_12 AS
SELECT race, COUNT(*) AS people
FROM adult
WHERE sex = 'Female'
GROUP BY race;
CREATE OR REPLACE TABLE report_count_13 AS
SELECT income, COUNT(*) AS people
FROM adult
WHERE age < 30
GROUP BY income;
CREATE OR REPLACE TABLE report_count_14 AS
SELECT income, COUNT(*) AS people
FROM adult
WHERE age >= 50
GROUP BY income;
CREATE OR REPLACE TABLE report_count_15 AS
SELECT sex, COUNT(*) AS people
FROM adult
WHERE hours_per_week >= 40
GROUP BY sex;
CREATE OR REPLACE TABLE report_count_16 AS
SELECT sex, COUNT(*) AS people
FROM adult
WHERE hours_per_week < 35
GROUP BY sex;
CREATE OR REPLACE TABLE report_count_17 AS
SELECT race, COUNT(*) AS people
FROM adult
WHERE hours_per_week >= 45
GROUP BY race;
CREATE OR REPLACE TABLE report_count_18 AS
SELECT income, COUNT(*) AS people
FROM adult
WHERE hours_per_week >= 60
GROUP BY income;
CREATE OR REPLACE TABLE report_count_19 AS
SELECT sex, race, COUNT(*) AS people
FROM adult
GROUP BY sex, race;
CREATE OR REPLACE TABLE report_count_20 AS
SELECT COUNT(*) AS people
FROM adult
WHERE age BETWEEN 30 AND 39 AND income = '>50K';

-- ---------------------------------------------------------------- 20 SUM(hours_per_week)
CREATE OR REPLACE TABLE report_sum_01 AS
SELECT sex, SUM(hours_per_week) AS hours
FROM adult
GROUP BY sex;
CREATE OR REPLACE TABLE report_sum_02 AS
SELECT race, SUM(hours_per_week) AS hours
FROM adult
GROUP BY race;
CREATE OR REPLACE TABLE report_sum_03 AS
SELECT income, SUM(hours_per_week) AS hours
FROM adult
GROUP BY income;
CREATE OR REPLACE TABLE report_sum_04 AS
SELECT sex, income, SUM(hours_per_week) AS hours
FROM adult
GROUP BY sex, income;
CREATE OR REPLACE TABLE report_sum_05 AS
SELECT race, income, SUM(hours_per_week) AS hours
FROM adult
GROUP BY race, income;
CREATE OR REPLACE TABLE report_sum_06 AS
SELECT SUM(hours_per_week) AS hours
FROM adult;
CREATE OR REPLACE TABLE report_sum_07 AS
SELECT SUM(hours_per_week) AS hours
FROM adult
WHERE age < 25;
CREATE OR REPLACE TABLE report_sum_08 AS
SELECT SUM(hours_per_week) AS hours
FROM adult
WHERE age BETWEEN 25 AND 44;
CREATE OR REPLACE TABLE report_sum_09 AS
SELECT SUM(hours_per_week) AS hours
FROM adult
WHERE age BETWEEN 45 AND 64;
CREATE OR REPLACE TABLE report_sum_10 AS
SELECT SUM(hours_per_week) AS hours
FROM adult
WHERE age >= 65;
CREATE OR REPLACE TABLE report_sum_11 AS
SELECT sex, SUM(hours_per_week) AS hours
FROM adult
WHERE income = '>50K'
GROUP BY sex;
CREATE OR REPLACE TABLE report_sum_12 AS
SELECT race, SUM(hours_per_week) AS hours
FROM adult
WHERE sex = 'Female'
GROUP BY race;
CREATE OR REPLACE TABLE report_sum_13 AS
SELECT income, SUM(hours_per_week) AS hours
FROM adult
WHERE age < 30
GROUP BY income;
CREATE OR REPLACE TABLE report_sum_14 AS
SELECT income, SUM(hours_per_week) AS hours
FROM adult
WHERE age >= 50
GROUP BY income;
CREATE OR REPLACE TABLE report_sum_15 AS
SELECT sex, race, SUM(hours_per_week) AS hours
FROM adult
GROUP BY sex, race;
CREATE OR REPLACE TABLE report_sum_16 AS
SELECT SUM(hours_per_week) AS hours
FROM adult
WHERE age BETWEEN 30 AND 39 AND income = '>50K';
CREATE OR REPLACE TABLE report_sum_17 AS
SELECT sex, SUM(hours_per_week) AS hours
FROM adult
WHERE age < 25
GROUP BY sex;
CREATE OR REPLACE TABLE report_sum_18 AS
SELECT income, SUM(hours_per_week) AS hours
FROM adult
WHERE race = 'White'
GROUP BY income;
CREATE OR REPLACE TABLE report_sum_19 AS
SELECT sex, SUM(hours_per_week) AS hours
FROM adult
WHERE race = 'Black'
GROUP BY sex;
CREATE OR REPLACE TABLE report_sum_20 AS
SELECT race, SUM(hours_per_week) AS hours
FROM adult
WHERE income = '>50K'
GROUP BY race;

-- ---------------------------------------------------------------- 10 AVG(age)
CREATE OR REPLACE TABLE report_avg_01 AS
SELECT sex, AVG(age) AS mean_age
FROM adult
GROUP BY sex;
CREATE OR REPLACE TABLE report_avg_02 AS
SELECT race, AVG(age) AS mean_age
FROM adult
GROUP BY race;
CREATE OR REPLACE TABLE report_avg_03 AS
SELECT income, AVG(age) AS mean_age
FROM adult
GROUP BY income;
CREATE OR REPLACE TABLE report_avg_04 AS
SELECT sex, income, AVG(age) AS mean_age
FROM adult
GROUP BY sex, income;
CREATE OR REPLACE TABLE report_avg_05 AS
SELECT AVG(age) AS mean_age
FROM adult;
CREATE OR REPLACE TABLE report_avg_06 AS
SELECT sex, AVG(age) AS mean_age
FROM adult
WHERE hours_per_week >= 40
GROUP BY sex;
CREATE OR REPLACE TABLE report_avg_07 AS
SELECT income, AVG(age) AS mean_age
FROM adult
WHERE hours_per_week < 35
GROUP BY income;
CREATE OR REPLACE TABLE report_avg_08 AS
SELECT race, AVG(age) AS mean_age
FROM adult
WHERE income = '>50K'
GROUP BY race;
CREATE OR REPLACE TABLE report_avg_09 AS
SELECT income, AVG(age) AS mean_age
FROM adult
WHERE sex = 'Female'
GROUP BY income;
CREATE OR REPLACE TABLE report_avg_10 AS
SELECT AVG(age) AS mean_age
FROM adult
WHERE hours_per_week >= 60;

-- ---------------------------------------------------------------- 5 quantiles by group
CREATE OR REPLACE TABLE report_quantile_01 AS
SELECT sex, MEDIAN(age) AS median_age
FROM adult
GROUP BY sex;
CREATE OR REPLACE TABLE report_quantile_02 AS
SELECT income, QUANTILE_CONT(hours_per_week, 0.9) AS p90_hours
FROM adult
GROUP BY income;
CREATE OR REPLACE TABLE report_quantile_03 AS
SELECT race, QUANTILE_CONT(age, 0.25) AS p25_age
FROM adult
GROUP BY race;
CREATE OR REPLACE TABLE report_quantile_04 AS
SELECT income, MEDIAN(age) AS median_age
FROM adult
GROUP BY income;
CREATE OR REPLACE TABLE report_quantile_05 AS
SELECT race, QUANTILE_CONT(hours_per_week, 0.5) AS median_hours
FROM adult
GROUP BY race;
