-- Curated views for analysts, over the per-table views (one per lake table, generated from the
-- column contract by gpu_pipeline.lib.io.warehouse: a typed empty relation unioned by name with the
-- table's `<lake>/<table>/date=YYYY-MM-DD/data.parquet` files that read as Parquet). `fleet_daily`
-- is such a table (computed in the staging pass, with the rules in force and the day's coverage):
-- the fleet's figures are read from it and recomputed by no view here (nor by the CLI's summary).

-- Waste per namespace and day across clusters and models: plain sums of priced_waste.
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
