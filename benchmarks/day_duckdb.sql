-- The peer of `make bench-day`: one fleet-day of dcgm-exporter scrapes -> gpu_minutes,
-- hourly_fleet_metrics and priced_waste in hand-written DuckDB SQL, with gpu_pipeline's
-- definitions (lib/staging/gpu_minutes.py, minute_runs.py, lib/money.py, lib/marts/
-- hourly_fleet_metrics.py, priced_waste.py) and the default rules (lib/rules.py). What it does
-- not do (validation, dedup, MIG, ledger, ...): benchmarks/README.md, "The DuckDB peer".
-- benchmarks/day_duckdb.py fills in the placeholders (dollar-brace names) and runs it in a process of its own.

SET threads = ${threads};
SET preserve_insertion_order = false;

-- A GPU catalog / price book model name as lib/reference.py `model_key` normalizes it.
CREATE MACRO model_key(s) AS regexp_replace(
    trim(regexp_replace(upper(s), '[-_\s]+', ' ', 'g')), '^(NVIDIA |TESLA |GEFORCE |QUADRO )+', '');

-- 1. The lines, split at '}' by the CSV reader: `a` = metric{labels, `b` = " value timestamp"
--    (comment lines have no '}': b is null). One row per label set and minute: per metric the
--    sum and count of its values (sums add up if a label set is split across files), the minute's
--    utilization samples per phase (the sub-minute phase shares), the last timestamp.
CREATE TEMP TABLE label_minutes AS
WITH split AS (
    SELECT a, filename, string_split(b, ' ') AS p  -- ['', value, timestamp]
    FROM read_csv('${raw}/**/*', columns = {'a': 'VARCHAR', 'b': 'VARCHAR'}, header = false,
                  delim = '}', quote = '', escape = '', auto_detect = false, null_padding = true,
                  filename = true)
    WHERE b IS NOT NULL
), lines AS (
    SELECT a, filename, TRY_CAST(p[2] AS DOUBLE) AS v, TRY_CAST(p[3] AS BIGINT) AS ts FROM split
), tagged AS (
    SELECT
        substr(a, instr(a, '{') + 1) AS labels,
        filename,
        ts // 60000 AS m,
        ts,
        v,
        CASE
            WHEN starts_with(a, 'DCGM_FI_DEV_GPU_UTIL{') THEN 1
            WHEN starts_with(a, 'DCGM_FI_DEV_POWER_USAGE{') THEN 2
            WHEN starts_with(a, 'DCGM_FI_DEV_GPU_TEMP{') THEN 3
            WHEN starts_with(a, 'DCGM_FI_DEV_FB_USED{') THEN 4
            WHEN starts_with(a, 'DCGM_FI_PROF_SM_ACTIVE{') THEN 5
            WHEN starts_with(a, 'DCGM_FI_PROF_SM_OCCUPANCY{') THEN 6
            WHEN starts_with(a, 'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{') THEN 7
            WHEN starts_with(a, 'DCGM_FI_PROF_DRAM_ACTIVE{') THEN 8
            WHEN starts_with(a, 'DCGM_FI_PROF_PCIE_RX_BYTES{') THEN 9
            WHEN starts_with(a, 'DCGM_FI_PROF_NVLINK_RX_BYTES{') THEN 10
        END AS k
    FROM lines
)
SELECT
    labels,
    m,
    any_value(filename) AS filename,
    max(ts) AS last_ts,
    sum(v) FILTER (k = 1) AS s_util,   count(v) FILTER (k = 1) AS n_util,
    sum(v) FILTER (k = 2) AS s_power,  count(v) FILTER (k = 2) AS n_power,
    max(v) FILTER (k = 3) AS temp,
    sum(v) FILTER (k = 4) AS s_fb,     count(v) FILTER (k = 4) AS n_fb,
    sum(v) FILTER (k = 5) AS s_sm,     count(v) FILTER (k = 5) AS n_sm,
    sum(v) FILTER (k = 6) AS s_occ,    count(v) FILTER (k = 6) AS n_occ,
    sum(v) FILTER (k = 7) AS s_tensor, count(v) FILTER (k = 7) AS n_tensor,
    sum(v) FILTER (k = 8) AS s_dram,   count(v) FILTER (k = 8) AS n_dram,
    sum(v) FILTER (k = 9) AS s_pcie,   count(v) FILTER (k = 9) AS n_pcie,
    sum(v) FILTER (k = 10) AS s_nvl,   count(v) FILTER (k = 10) AS n_nvl,
    -- utilization samples by phase (rules: idle < 10 <= underutilized < 70 <= productive < 90)
    count(*) FILTER (k = 1 AND v < 10) AS c_idle,
    count(*) FILTER (k = 1 AND v >= 10 AND v < 70) AS c_under,
    count(*) FILTER (k = 1 AND v >= 70 AND v < 90) AS c_prod,
    count(*) FILTER (k = 1 AND v >= 90) AS c_cb
FROM tagged
WHERE k IS NOT NULL
GROUP BY labels, m
-- the day's minutes (a filter on the lines' timestamps would parse them twice)
HAVING m >= ${day_start_ms} // 60000 AND m < ${day_end_ms} // 60000;

-- 2. Each distinct label set's GPU and attributes (a thousand strings, not 17 M lines): the
--    UUID normalized (GPU- prefix, lower case), the cluster label or else the landing folder.
CREATE TEMP TABLE label_sets AS
SELECT
    labels,
    'GPU-' || regexp_replace(lower(trim(regexp_extract(labels, '(?:^|,)UUID="([^"]*)"', 1))), '^gpu-', '') AS gpu_uuid,
    nullif(regexp_extract(labels, '(?i)(?:^|,)(?:hostname|host|node)="([^"]*)"', 1), '') AS hostname,
    coalesce(nullif(regexp_extract(labels, '(?i)(?:^|,)cluster="([^"]*)"', 1), ''),
             CASE WHEN contains(substr(filename, length('${raw}') + 2), '/')
                  THEN split_part(substr(filename, length('${raw}') + 2), '/', 1) END) AS cluster,
    coalesce(nullif(regexp_extract(labels, '(?i)(?:^|,)exported_namespace="([^"]*)"', 1), ''),
             nullif(regexp_extract(labels, '(?i)(?:^|,)namespace="([^"]*)"', 1), '')) AS namespace,
    coalesce(nullif(regexp_extract(labels, '(?i)(?:^|,)exported_pod="([^"]*)"', 1), ''),
             nullif(regexp_extract(labels, '(?i)(?:^|,)pod="([^"]*)"', 1), '')) AS pod,
    nullif(regexp_extract(labels, '(?i)(?:^|,)modelName="([^"]*)"', 1), '') AS gpu_model
FROM (SELECT labels, any_value(filename) AS filename FROM label_minutes GROUP BY labels);

-- a number for each label set, and its model's catalog / price book key (a thousand
-- normalizations, not one a minute)
ALTER TABLE label_sets ADD COLUMN lid INTEGER;
ALTER TABLE label_sets ADD COLUMN model_key VARCHAR;
UPDATE label_sets SET lid = rowid, model_key = model_key(gpu_model);

CREATE TEMP TABLE catalog AS
SELECT model_key(gpu_model) AS key, max_power_w::DOUBLE AS max_power_w,
       achievable_fp16_tflops::DOUBLE AS achievable_tflops
FROM read_csv('${reference}/gpu_catalog.csv', comment = '#', header = true);

CREATE TEMP TABLE prices AS
SELECT model_key(gpu_model) AS key, on_demand_usd_per_hour::DOUBLE AS price
FROM read_csv('${reference}/prices.csv', comment = '#', header = true);

-- 3. One row per GPU and minute: the means, the last attributes of the minute, the metric stack.
CREATE TEMP TABLE minutes AS
WITH g AS (
    SELECT
        l.gpu_uuid,
        lm.m,
        -- the attributes are the minute's last label set's (a number here, joined below)
        arg_max(l.lid, lm.last_ts) AS lid,
        sum(s_util) / nullif(sum(n_util), 0) AS gpu_util_pct,
        sum(n_util) AS n_util,
        sum(s_power) / nullif(sum(n_power), 0) AS power_w,
        max(temp) AS gpu_temp_c,
        sum(s_fb) / nullif(sum(n_fb), 0) AS fb_used_mib,
        sum(s_sm) / nullif(sum(n_sm), 0) AS prof_sm_active,
        sum(s_occ) / nullif(sum(n_occ), 0) AS prof_sm_occupancy,
        sum(s_tensor) / nullif(sum(n_tensor), 0) AS prof_pipe_tensor_active,
        sum(s_dram) / nullif(sum(n_dram), 0) AS prof_dram_active,
        sum(s_pcie) / nullif(sum(n_pcie), 0) AS pcie_rx_bytes_per_s,
        sum(s_nvl) / nullif(sum(n_nvl), 0) AS nvlink_rx_bytes_per_s,
        sum(c_idle) AS c_idle, sum(c_under) AS c_under, sum(c_prod) AS c_prod, sum(c_cb) AS c_cb
    FROM label_minutes lm JOIN label_sets l USING (labels)
    GROUP BY l.gpu_uuid, lm.m
), p AS (  -- PIF against the catalog's max power, clipped to 0..1
    SELECT g.*,
        l.hostname, l.cluster, l.namespace, l.pod, l.gpu_model,
        make_timestamp(m * 60000000) AS minute,
        c.max_power_w,
        c.achievable_tflops,
        pr.price AS price_usd_per_hour,
        greatest(least(power_w / c.max_power_w, 1.0), 0.0) AS pif
    FROM g
    JOIN label_sets l USING (lid)
    LEFT JOIN catalog c ON c.key = l.model_key
    LEFT JOIN prices pr ON pr.key = l.model_key
), q AS (
    SELECT p.*,
        achievable_tflops * pif AS realized_tflops,
        pif * 100.0 AS rfu_pct,
        gpu_util_pct - pif * 100.0 AS efficiency_gap_pct,
        CASE WHEN gpu_util_pct IS NULL THEN 'unknown'
             WHEN gpu_util_pct < 10 THEN 'idle'
             WHEN gpu_util_pct < 70 THEN 'underutilized'
             WHEN gpu_util_pct < 90 THEN 'productive'
             ELSE 'compute_bound' END AS phase,
        CASE WHEN gpu_util_pct IS NULL THEN NULL
             WHEN gpu_util_pct < 10 THEN 'idle'
             WHEN gpu_util_pct >= 70 AND pif IS NULL THEN NULL
             WHEN gpu_util_pct >= 70 AND pif < 0.4 THEN 'bottlenecked'
             WHEN gpu_util_pct >= 70 AND pif >= 0.6 THEN 'efficient'
             WHEN gpu_util_pct < 30 THEN 'inefficient'
             ELSE 'moderate' END AS efficiency_class,
        -- busy (util >= 70 with a PIF) at high (>= 0.6) / low (< 0.4) power: power's diagnosis
        coalesce(gpu_util_pct >= 70 AND pif >= 0.6, false) AS hi,
        coalesce(gpu_util_pct >= 70 AND pif < 0.4, false) AS lo
    FROM p
), d AS (
    SELECT q.*,
        CASE WHEN gpu_util_pct < 10 THEN 'idle'
             WHEN prof_sm_active IS NULL THEN
                 CASE WHEN hi THEN 'compute_bound' WHEN lo THEN 'data_starved' ELSE 'unknown' END
             WHEN prof_sm_active < 0.30 THEN
                 CASE WHEN prof_dram_active >= 0.80 THEN 'memory_bound'
                      WHEN nvlink_rx_bytes_per_s >= 5e9 THEN 'communication_bound'
                      ELSE 'data_starved' END
             WHEN prof_sm_active >= 0.70 THEN
                 CASE WHEN prof_dram_active >= 0.80 THEN 'memory_bound'
                      WHEN prof_pipe_tensor_active < 0.05 THEN 'tensor_cores_unused'
                      ELSE 'compute_bound' END
             WHEN prof_pipe_tensor_active < 0.05 THEN 'tensor_cores_unused'
             WHEN prof_sm_occupancy < 0.20 THEN 'low_occupancy'
             ELSE 'mixed' END AS diagnosis,
        CASE WHEN prof_sm_active IS NOT NULL THEN 'dcgm_profiling'
             WHEN gpu_util_pct < 10 THEN 'utilization'
             WHEN (hi OR lo) AND pcie_rx_bytes_per_s IS NOT NULL THEN 'power_pcie'
             WHEN hi OR lo THEN 'power'
             ELSE 'none' END AS diagnosis_basis,
        -- sub-minute phase shares: of the minute's utilization samples when it has several
        n_util > 1 AS from_samples
    FROM q
)
SELECT
    CAST(minute AS DATE) AS date, minute, gpu_uuid, hostname, cluster, namespace, pod, gpu_model,
    gpu_util_pct, CASE WHEN gpu_util_pct IS NOT NULL THEN 'gpu_util' END AS util_source,
    power_w, max_power_w, CASE WHEN max_power_w IS NOT NULL THEN 'catalog' END AS max_power_basis,
    pif, achievable_tflops, realized_tflops, rfu_pct, efficiency_gap_pct, phase,
    efficiency_class, diagnosis, diagnosis_basis, price_usd_per_hour,
    CASE WHEN from_samples THEN c_idle / n_util ELSE (phase = 'idle')::DOUBLE END AS phase_share_idle,
    CASE WHEN from_samples THEN c_under / n_util ELSE (phase = 'underutilized')::DOUBLE END AS phase_share_underutilized,
    CASE WHEN from_samples THEN c_prod / n_util ELSE (phase = 'productive')::DOUBLE END AS phase_share_productive,
    CASE WHEN from_samples THEN c_cb / n_util ELSE (phase = 'compute_bound')::DOUBLE END AS phase_share_compute_bound,
    CASE WHEN from_samples THEN 0.0 ELSE (phase = 'unknown')::DOUBLE END AS phase_share_unknown,
    1.0 AS gpu_share,
    gpu_temp_c, fb_used_mib, prof_sm_active, prof_sm_occupancy, prof_pipe_tensor_active,
    prof_dram_active, pcie_rx_bytes_per_s, nvlink_rx_bytes_per_s
FROM d;

COPY minutes TO '${out}/gpu_minutes.parquet' (FORMAT parquet, COMPRESSION zstd);

-- 4. hourly_fleet_metrics: hour x cluster x model means over the minutes that have the metric,
--    phase shares as the minutes' sub-minute shares.
COPY (
    SELECT
        date,
        date_trunc('hour', minute) AS hour,
        cluster,
        gpu_model,
        count(DISTINCT gpu_uuid) AS gpus,
        count(*) AS gpu_minutes,
        avg(gpu_util_pct) AS avg_gpu_util_pct,
        avg(pif) AS avg_pif,
        avg(rfu_pct) AS avg_rfu_pct,
        avg(efficiency_gap_pct) AS avg_efficiency_gap_pct,
        avg(realized_tflops) AS avg_realized_tflops,
        100.0 * sum(phase_share_idle) / count(phase) AS pct_idle,
        100.0 * sum(phase_share_underutilized) / count(phase) AS pct_underutilized,
        100.0 * sum(phase_share_productive) / count(phase) AS pct_productive,
        100.0 * sum(phase_share_compute_bound) / count(phase) AS pct_compute_bound,
        100.0 * sum(phase_share_unknown) / count(phase) AS pct_unknown
    FROM minutes
    GROUP BY ALL
    ORDER BY hour, cluster, gpu_model
) TO '${out}/hourly_fleet_metrics.parquet' (FORMAT parquet, COMPRESSION zstd);

-- 5. priced_waste: each minute's price / 60 split into productive (RFU), idle (its idle share),
--    stall (util - RFU) and headroom (the rest), nothing twice (lib/money.py minute_costs).
COPY (
    WITH c AS (
        SELECT *,
            price_usd_per_hour * gpu_share / 60.0 AS cost,
            coalesce(phase_share_idle, 0.0) AS idle,
            1.0 - coalesce(phase_share_idle, 0.0) AS busy,
            gpu_util_pct IS NOT NULL AND rfu_pct IS NOT NULL AS measured
        FROM minutes
    ), s AS (
        SELECT *,
            least(rfu_pct / 100.0, busy) AS productive,
            least(greatest(gpu_util_pct - rfu_pct, 0.0) / 100.0,
                  busy - least(rfu_pct / 100.0, busy)) AS stalled,
            idle < 1.0 AND measured AS split
        FROM c
    ), money AS (
        SELECT date, cluster, namespace, gpu_model, gpu_uuid, gpu_share, price_usd_per_hour,
            cost AS cost_usd,
            CASE WHEN split THEN cost * productive ELSE 0.0 END AS productive_usd,
            cost * idle AS idle_waste_usd,
            CASE WHEN split THEN cost * stalled ELSE 0.0 END AS stall_waste_usd,
            CASE WHEN split THEN cost * (busy - productive - stalled) ELSE 0.0 END AS headroom_waste_usd,
            CASE WHEN idle < 1.0 AND NOT measured THEN cost * busy ELSE 0.0 END AS unmeasured_usd
        FROM s
    ), w AS (
        SELECT date, cluster, namespace, gpu_model,
            count(DISTINCT gpu_uuid) AS gpus,
            sum(gpu_share) / 60.0 AS gpu_hours,
            max(price_usd_per_hour) AS price_usd_per_hour,
            -- a group without a price has no cost: null, not zero
            CASE WHEN bool_or(price_usd_per_hour IS NOT NULL) THEN sum(cost_usd) END AS cost_usd,
            CASE WHEN bool_or(price_usd_per_hour IS NOT NULL) THEN sum(productive_usd) END AS productive_usd,
            CASE WHEN bool_or(price_usd_per_hour IS NOT NULL) THEN sum(idle_waste_usd) END AS idle_waste_usd,
            CASE WHEN bool_or(price_usd_per_hour IS NOT NULL) THEN sum(stall_waste_usd) END AS stall_waste_usd,
            CASE WHEN bool_or(price_usd_per_hour IS NOT NULL) THEN sum(headroom_waste_usd) END AS headroom_waste_usd,
            CASE WHEN bool_or(price_usd_per_hour IS NOT NULL) THEN sum(unmeasured_usd) END AS unmeasured_usd
        FROM money
        GROUP BY ALL
    )
    SELECT *,
        idle_waste_usd + stall_waste_usd + headroom_waste_usd AS total_waste_usd,
        (idle_waste_usd + stall_waste_usd + headroom_waste_usd) / cost_usd AS waste_frac,
        (idle_waste_usd + stall_waste_usd + headroom_waste_usd) / gpu_hours AS hourly_waste_usd,
        round((idle_waste_usd + stall_waste_usd + headroom_waste_usd) / gpu_hours * 720, 2) AS monthly_waste_usd,
        round((idle_waste_usd + stall_waste_usd + headroom_waste_usd) / gpu_hours * 8760, 2) AS yearly_waste_usd
    FROM w
    ORDER BY cluster, namespace, gpu_model
) TO '${out}/priced_waste.parquet' (FORMAT parquet, COMPRESSION zstd);
