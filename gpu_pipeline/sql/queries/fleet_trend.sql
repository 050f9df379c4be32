-- Daily fleet trend: utilization vs realized TFLOPS utilization (RFU), the gap, and waste.
SELECT
    f.date,
    f.gpus,
    round(f.gpu_hours, 1)               AS gpu_hours,
    round(f.avg_gpu_util_pct, 1)        AS util_pct,
    round(f.avg_rfu_pct, 1)             AS rfu_pct,
    round(f.avg_efficiency_gap_pct, 1)  AS gap_pts,
    round(f.pct_idle, 1)                AS idle_pct,
    round(w.waste_usd, 2)               AS waste_usd
FROM fleet_daily f
LEFT JOIN (SELECT date, sum(total_waste_usd) AS waste_usd FROM priced_waste GROUP BY date) w USING (date)
ORDER BY f.date;
