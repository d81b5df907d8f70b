-- Age distribution of the Adult census extract (ages 17 to 90 declared in the policy).
--
-- Cumulative counts (people younger than k) for several k, then ten-year bands, answered
-- as one workload so that the noise is shared and the least-squares answers stay
-- consistent with each other. Run:   dpsql run census.duckdb sql/age_distribution.sql

SET dpsql.release = 'age-distribution-2026-11';
SET dpsql.epsilon = 0.4;
SET dpsql.delta = 2e-6;

-- cumulative: people younger than k
CREATE OR REPLACE TABLE age_under_25 AS SELECT COUNT(*) AS people FROM adult WHERE age < 25;
CREATE OR REPLACE TABLE age_under_35 AS SELECT COUNT(*) AS people FROM adult WHERE age < 35;
CREATE OR REPLACE TABLE age_under_45 AS SELECT COUNT(*) AS people FROM adult WHERE age < 45;
CREATE OR REPLACE TABLE age_under_55 AS SELECT COUNT(*) AS people FROM adult WHERE age < 55;
CREATE OR REPLACE TABLE age_under_65 AS SELECT COUNT(*) AS people FROM adult WHERE age < 65;

-- bands, split by sex
CREATE OR REPLACE TABLE age_17_24 AS
SELECT sex, COUNT(*) AS people FROM adult WHERE age BETWEEN 17 AND 24 GROUP BY sex;
CREATE OR REPLACE TABLE age_25_34 AS
SELECT sex, COUNT(*) AS people FROM adult WHERE age BETWEEN 25 AND 34 GROUP BY sex;
CREATE OR REPLACE TABLE age_35_44 AS
SELECT sex, COUNT(*) AS people FROM adult WHERE age BETWEEN 35 AND 44 GROUP BY sex;
CREATE OR REPLACE TABLE age_45_54 AS
SELECT sex, COUNT(*) AS people FROM adult WHERE age BETWEEN 45 AND 54 GROUP BY sex;
CREATE OR REPLACE TABLE age_55_64 AS
SELECT sex, COUNT(*) AS people FROM adult WHERE age BETWEEN 55 AND 64 GROUP BY sex;
CREATE OR REPLACE TABLE age_65_plus AS
SELECT sex, COUNT(*) AS people FROM adult WHERE age >= 65 GROUP BY sex;
