-- Which workloads (a pod's owner: Deployment, StatefulSet, Job, CronJob) waste the most money over
-- the whole lake, and what to do first? Plain sums of workload_efficiency; the diagnosis and
-- action of each workload's most wasteful day.
SELECT
    cluster,
    namespace,
    coalesce(workload, '(no pod)')                                     AS workload,
    count(DISTINCT date)                                               AS days,
    round(sum(gpu_hours), 1)                                           AS gpu_hours,
    round(sum(cost_usd), 2)                                            AS cost_usd,
    round(sum(total_waste_usd), 2)                                     AS waste_usd,
    round(100 * sum(total_waste_usd) / sum(cost_usd), 1)               AS waste_pct,
    round(sum(idle_waste_usd), 2)                                      AS idle_usd,
    round(sum(stall_waste_usd), 2)                                     AS stall_usd,
    round(sum(headroom_waste_usd), 2)                                  AS headroom_usd,
    round(sum(total_waste_usd) / sum(gpu_hours) * 720, 2)              AS monthly_waste_usd_per_gpu,
    arg_max(main_diagnosis, (coalesce(total_waste_usd, -1), date))     AS main_diagnosis,
    arg_max(top_action, (coalesce(total_waste_usd, -1), date))         AS top_action
FROM workload_efficiency
GROUP BY cluster, namespace, workload
ORDER BY waste_usd DESC NULLS LAST, cluster, namespace, workload
LIMIT 10;
