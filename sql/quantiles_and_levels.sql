-- Medians, a percentile and levels of schooling on the Adult census extract.
--
-- Quantiles (MEDIAN, QUANTILE_CONT) and a join to the public table education_levels that
-- the demo policy declares (dpsql/data/adult_policy.toml: each education value's level).
-- Each quantile is measured as counts of its column's CDF per group (col < e and col >= e
-- at every declared edge) and comes with a 95% interval (ci_low, ci_high) read off that
-- noisy CDF; its stderr is NULL. See docs/sql.md#quantiles and
-- docs/sql.md#joins-to-public-tables.   Run:   dpsql run census.duckdb sql/quantiles_and_levels.sql
--
-- Two workloads: the quantiles share one measurement (their CDFs are hundreds of counts);
-- the counts by level get their own, so that the CDFs do not take their budget.

SET dpsql.release = 'quantiles-and-levels-2026-11';
SET dpsql.delta = 1e-6;

-- workload 1: quantiles
SET dpsql.epsilon = 0.03;

-- median age of women and men
CREATE OR REPLACE TABLE median_age_by_sex AS
SELECT sex, MEDIAN(age) AS median_age FROM adult GROUP BY sex;

-- 90th percentile of weekly hours, by income band (hours are declared in bins: the
-- percentile is interpolated inside its bin)
CREATE OR REPLACE TABLE hours_p90_by_income AS
SELECT income, QUANTILE_CONT(hours_per_week, 0.9) AS p90_hours FROM adult GROUP BY income;

-- median age by level of schooling (the level comes from the public table)
CREATE OR REPLACE TABLE median_age_by_level AS
SELECT level, MEDIAN(age) AS median_age
FROM adult JOIN education_levels USING (education)
GROUP BY level;

-- workload 2: counts (a SET after queries starts it)
SET dpsql.epsilon = 0.02;

-- people by level of schooling and sex
CREATE OR REPLACE TABLE people_by_level AS
SELECT level, sex, COUNT(*) AS people
FROM adult JOIN education_levels USING (education)
GROUP BY level, sex;
