-- GPUs flagged as persistent bottlenecks on the most days, with where they run.
SELECT
    gpu_uuid,
    hostname,
    namespace,
    gpu_model,
    count(*)                          AS days_flagged,
    min(date)                         AS first_flagged,
    max(date)                         AS last_flagged,
    round(avg(bottleneck_share), 3)   AS avg_bottleneck_share
FROM persistent_bottlenecks
GROUP BY gpu_uuid, hostname, namespace, gpu_model
ORDER BY days_flagged DESC, avg_bottleneck_share DESC;
