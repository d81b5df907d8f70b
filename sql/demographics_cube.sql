-- Demographic cross-tabulation of the Adult census extract.
--
-- Every combination of sex, race and income band, with all subtotals (CUBE), and marital
-- status by sex. One workload: the noise is optimised for all tables together and charged
-- once. Run:   dpsql run census.duckdb sql/demographics_cube.sql
-- Re-running returns the recorded answers and charges nothing; for a new edition change
-- the release name below (or pass --release NAME).

SET dpsql.release = 'demographics-cube-2026-11';
SET dpsql.epsilon = 0.5;
SET dpsql.delta = 2e-6;
SET dpsql.strategy = 'auto';

-- 3 x 6 x 3 groups (NULL = rolled up): people by sex, race and income band
CREATE OR REPLACE TABLE demographics_sex_race_income AS
SELECT sex, race, income, COUNT(*) AS people
FROM adult
GROUP BY CUBE (sex, race, income);

-- marital status by sex, with the totals of each
CREATE OR REPLACE TABLE demographics_marital_sex AS
SELECT marital_status, sex, COUNT(*) AS people
FROM adult
GROUP BY CUBE (marital_status, sex);
