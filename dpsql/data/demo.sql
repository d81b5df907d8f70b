-- dpsql demo batch: answered together as ONE workload, charged once.

-- Who earns more than 50K, by sex and race (every combination, with totals)
CREATE TABLE demo_income AS
SELECT sex, race, COUNT(*) AS people
FROM adult
WHERE income = '>50K'
GROUP BY CUBE(sex, race);

-- Age bands of full-time workers
SELECT COUNT(*) AS young_full_time FROM adult WHERE age < 30 AND hours_per_week >= 40;
SELECT COUNT(*) AS midlife_full_time FROM adult WHERE age BETWEEN 30 AND 49 AND hours_per_week >= 40;
SELECT COUNT(*) AS older_full_time FROM adult WHERE age >= 50 AND hours_per_week >= 40;

-- Degree holders outside the private sector (NOT IN keeps the undeclared '?' rows)
SELECT COUNT(*) AS degree_not_private FROM adult
WHERE education IN ('Bachelors', 'Masters', 'Doctorate') AND workclass NOT IN ('Private');
