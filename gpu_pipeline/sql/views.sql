-- Curated views for analysts, over the per-table views (one per lake table, generated from the
-- column contract by gpu_pipeline.lib.io.warehouse: a typed empty relation unioned by name with the
-- table's `<lake>/<table>/date=YYYY-MM-DD/data.parquet` files that read as Parquet).

-- One row per day for the whole fleet. Fleet totals count each physical GPU once: the rows of
-- MIG instances (gpu_instance_id set) are parts of a GPU whose own row is counted.
CREATE OR REPLACE VIEW fleet_daily AS
SELECT
    date,
    count(DISTINCT gpu_uuid)                                   AS gpus,
    count(*) / 60.0                                            AS gpu_hours,
    avg(gpu_util_pct)                                          AS avg_gpu_util_pct,
    avg(rfu_pct)                                               AS avg_rfu_pct,
    avg(efficiency_gap_pct)                                    AS avg_efficiency_gap_pct,
    avg(pif)                                                   AS avg_pif,
    100.0 * count(*) FILTER (phase = 'idle') / count(*)          AS pct_idle,
    100.0 * count(*) FILTER (phase = 'underutilized') / count(*) AS pct_underutilized,
    100.0 * count(*) FILTER (phase = 'productive') / count(*)    AS pct_productive,
    100.0 * count(*) FILTER (phase = 'compute_bound') / count(*) AS pct_compute_bound,
    100.0 * count(*) FILTER (phase = 'unknown') / count(*)       AS pct_unknown,
    100.0 * count(*) FILTER (efficiency_class = 'bottlenecked')
          / nullif(count(*) FILTER (gpu_util_pct >= 10), 0)    AS pct_active_bottlenecked
FROM gpu_minutes
WHERE gpu_instance_id IS NULL
GROUP BY date;

-- Waste per namespace and day across clusters and models.
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
