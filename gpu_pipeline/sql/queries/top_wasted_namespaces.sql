-- Which namespaces waste the most money over the whole lake, and how (idle, stall, headroom)?
SELECT
    namespace,
    gpu_model,
    round(sum(gpu_hours), 1)                              AS gpu_hours,
    round(sum(cost_usd), 2)                               AS cost_usd,
    round(sum(total_waste_usd), 2)                        AS waste_usd,
    round(100 * sum(total_waste_usd) / sum(cost_usd), 1)  AS waste_pct,
    round(sum(idle_waste_usd), 2)                         AS idle_usd,
    round(sum(stall_waste_usd), 2)                        AS stall_usd,
    round(sum(headroom_waste_usd), 2)                     AS headroom_usd,
    round(sum(total_waste_usd) / sum(gpu_hours) * 720, 2) AS monthly_waste_usd_per_gpu
FROM priced_waste
GROUP BY namespace, gpu_model
ORDER BY waste_usd DESC
LIMIT 10;
