-- Views over the Parquet lake. `{lake}` is replaced by the lake root (quoted safely) when the
-- views file is built; `date` is a column inside every file, so hive partitioning stays off.
-- `<table>/*/data.parquet` matches every `date=…` partition and the zero-row `_schema` file, so a
-- view binds before the first partition exists; the glob is re-read at every query.
-- One view per table, then curated views for analysts.

CREATE OR REPLACE VIEW gpu_samples AS
SELECT * FROM read_parquet('{lake}/gpu_samples/*/data.parquet', union_by_name = true, hive_partitioning = false);

CREATE OR REPLACE VIEW quarantine AS
SELECT * FROM read_parquet('{lake}/quarantine/*/data.parquet', union_by_name = true, hive_partitioning = false);

CREATE OR REPLACE VIEW ingest_log AS
SELECT * FROM read_parquet('{lake}/ingest_log/*/data.parquet', union_by_name = true, hive_partitioning = false);

CREATE OR REPLACE VIEW gpu_minutes AS
SELECT * FROM read_parquet('{lake}/gpu_minutes/*/data.parquet', union_by_name = true, hive_partitioning = false);

CREATE OR REPLACE VIEW gpu_daily AS
SELECT * FROM read_parquet('{lake}/gpu_daily/*/data.parquet', union_by_name = true, hive_partitioning = false);

CREATE OR REPLACE VIEW hourly_fleet_metrics AS
SELECT * FROM read_parquet('{lake}/hourly_fleet_metrics/*/data.parquet', union_by_name = true, hive_partitioning = false);

CREATE OR REPLACE VIEW persistent_bottlenecks AS
SELECT * FROM read_parquet('{lake}/persistent_bottlenecks/*/data.parquet', union_by_name = true, hive_partitioning = false);

CREATE OR REPLACE VIEW priced_waste AS
SELECT * FROM read_parquet('{lake}/priced_waste/*/data.parquet', union_by_name = true, hive_partitioning = false);

CREATE OR REPLACE VIEW recommendations AS
SELECT * FROM read_parquet('{lake}/recommendations/*/data.parquet', union_by_name = true, hive_partitioning = false);

CREATE OR REPLACE VIEW gpu_health AS
SELECT * FROM read_parquet('{lake}/gpu_health/*/data.parquet', union_by_name = true, hive_partitioning = false);

CREATE OR REPLACE VIEW stragglers AS
SELECT * FROM read_parquet('{lake}/stragglers/*/data.parquet', union_by_name = true, hive_partitioning = false);

CREATE OR REPLACE VIEW efficiency_roi AS
SELECT * FROM read_parquet('{lake}/efficiency_roi/*/data.parquet', union_by_name = true, hive_partitioning = false);

CREATE OR REPLACE VIEW namespace_efficiency AS
SELECT * FROM read_parquet('{lake}/namespace_efficiency/*/data.parquet', union_by_name = true, hive_partitioning = false);

-- Curated: one row per day for the whole fleet.
CREATE OR REPLACE VIEW fleet_daily AS
SELECT
    date,
    count(DISTINCT gpu_uuid)                                   AS gpus,
    count(*) / 60.0                                            AS gpu_hours,
    avg(gpu_util_pct)                                          AS avg_gpu_util_pct,
    avg(rfu_pct)                                               AS avg_rfu_pct,
    avg(efficiency_gap_pct)                                    AS avg_efficiency_gap_pct,
    avg(pif)                                                   AS avg_pif,
    100.0 * count(*) FILTER (phase = 'idle') / count(phase)          AS pct_idle,
    100.0 * count(*) FILTER (phase = 'underutilized') / count(phase) AS pct_underutilized,
    100.0 * count(*) FILTER (phase = 'productive') / count(phase)    AS pct_productive,
    100.0 * count(*) FILTER (phase = 'compute_bound') / count(phase) AS pct_compute_bound,
    100.0 * count(*) FILTER (efficiency_class = 'bottlenecked')
          / nullif(count(*) FILTER (gpu_util_pct >= 10), 0)    AS pct_active_bottlenecked
FROM gpu_minutes
GROUP BY date;

-- Curated: waste per namespace and day across clusters and models.
CREATE OR REPLACE VIEW namespace_waste AS
SELECT
    date,
    namespace,
    sum(gpu_hours)                          AS gpu_hours,
    sum(cost_usd)                           AS cost_usd,
    sum(total_waste_usd)                    AS total_waste_usd,
    sum(idle_waste_usd)                     AS idle_waste_usd,
    sum(stall_waste_usd)                    AS stall_waste_usd,
    sum(headroom_waste_usd)                 AS headroom_waste_usd,
    sum(total_waste_usd) / sum(cost_usd)    AS waste_frac
FROM priced_waste
GROUP BY date, namespace;
