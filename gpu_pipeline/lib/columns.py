"""What each column means (docs/metrics.md, in a sentence): the catalog's documentation.

A name means the same thing in every table unless `BY_TABLE` says otherwise; the telemetry
columns of `gpu_samples` are described from `lib/fields.py` (their DCGM field and unit).
`tests/test_pipeline.py` checks that every column of every table has a description.
"""

from __future__ import annotations

from gpu_pipeline.lib.fields import FIELDS

COLUMNS: dict[str, str] = {
    # keys and labels
    "date": "UTC day of the partition",
    "month": "UTC calendar month (YYYY-MM)",
    "days_covered": "days of the month with GPU-hours in the lake (month to date: so far)",
    "timestamp": "sample time (UTC, ms)",
    "minute": "start of the UTC minute",
    "hour": "start of the UTC hour",
    "gpu_uuid": "GPU UUID (a MIG instance keeps its physical GPU's UUID)",
    "gpu_instance_id": "MIG GPU instance id; null for a whole GPU",
    "gpu_instance_profile": "MIG profile (e.g. 1g.10gb); null for a whole GPU",
    "gpu_index": "GPU index on its host (a loop log without identity: its row in the iteration)",
    "pci_bus_id": "PCI bus id (00000000:3B:00.0); with the host or file, the identity of a GPU "
    "without a UUID",
    "hostname": "host the GPU is in",
    "cluster": "cluster (the landing folder or the series' cluster label)",
    "namespace": "Kubernetes namespace running on the GPU; null when its series carry none",
    "pod": "pod running on the GPU",
    "container": "container running on the GPU",
    "hpc_job": "HPC job on the GPU (dcgm-exporter's `hpc_job` label: Slurm's job id); null: none",
    "gpu_model": "GPU model name as exported (modelName / name)",
    "driver_version": "NVIDIA driver version",
    "source_file": "landing file the row came from (path under the landing zone)",
    # quarantine and ingest log
    "line": "line (or record number) in the source file; null for the whole file",
    "reason": "why the record, value or file was rejected",
    "raw": "the original text of the rejected record (bounded)",
    "field": "the field whose value was rejected; null when the record as a whole was",
    "record_kept": "the record's other values were accepted: one value lost, not the record",
    "format": "detected format of the landing file",
    "time_basis": "where the file's times came from and in which unit",
    "sha256": "content hash of the landing file",
    "rows_read": "records read from the file on this day (a record: a line of a text format, "
    "a row of a CSV, a point of JSON, a GPU of an XML snapshot)",
    "rows_accepted": "records with a value filed in gpu_samples",
    "rows_quarantined": "records rejected as a whole (see quarantine)",
    "rows_duplicate": "records whose every value was already read (counted, not lost)",
    "lines_skipped": "comment and blank lines, series of other things than GPUs (not records)",
    "file_lines": "lines in the file",
    "file_bytes": "size of the file in bytes",
    "first_sample": "earliest sample time in the file",
    "last_sample": "latest sample time in the file",
    "origin": "where the file came from (a server and query for pulled files; never credentials)",
    "columns_ignored": "header names of the file that map to no field (CSV formats)",
    "fields": "the telemetry fields the file gives (its header's or its series')",
    "skip_reason": "why a listed file was not read (hidden files)",
    # minute metrics
    "samples": "samples averaged into the minute",
    "gpu_util_pct": "reported GPU utilization, % (minute mean)",
    "util_source": "signal the utilization came from: gpu_util, prof_gr_engine_active or mig_instances",
    "power_w": "power draw, W (minute mean)",
    "max_power_w": "power the PIF divides by: catalog TDP, else the power limit seen",
    "max_power_basis": "which max_power_w was used: catalog or power_limit (null: neither known)",
    "pif": "Power Intensity Factor: clip(power_w / max_power_w, 0, 1)",
    "achievable_tflops": "achievable FP16 TFLOPS of the model (catalog); null if unknown",
    "realized_tflops": "achievable_tflops x pif",
    "rfu_pct": "Realized TFLOPS Utilization, % = 100 x pif",
    "efficiency_gap_pct": "gpu_util_pct - rfu_pct: utilization that did no work",
    "phase": "idle < 10 <= underutilized < 70 <= productive < 90 <= compute_bound (util %)",
    "efficiency_class": "idle, bottlenecked, efficient, inefficient or moderate (util and pif)",
    "diagnosis": "likely cause: data_starved, communication_bound, memory_bound, compute_bound, tensor_cores_unused, low_occupancy, mixed, idle or unknown",
    "diagnosis_basis": "signals the diagnosis was read from: dcgm_profiling, utilization, power, power_pcie or none",
    "price_usd_per_hour": "on-demand price of one GPU-hour of the model (price book)",
    "phase_share_idle": "share of the minute's samples in the idle phase",
    "phase_share_underutilized": "share of the minute's samples in the underutilized phase",
    "phase_share_productive": "share of the minute's samples in the productive phase",
    "phase_share_compute_bound": "share of the minute's samples in the compute_bound phase",
    "phase_share_unknown": "share of the minute's samples without utilization (MIG [N/A])",
    "gpu_share": "share of the physical GPU (MIG slices / slices of the model; 1 for a whole GPU)",
    "note": "why a value is null or estimated (unknown model, no power limit, ...)",
    # daily and rollups
    "minutes": "GPU-minutes with samples",
    "active_minutes": "minutes with util >= the active threshold (phases.idle_below, 10 %)",
    "bottlenecked_minutes": "active minutes classed bottlenecked",
    "idle_minutes": "minutes in the idle phase",
    "underutilized_minutes": "minutes in the underutilized phase",
    "productive_minutes": "minutes in the productive phase",
    "compute_bound_minutes": "minutes in the compute_bound phase",
    "unknown_minutes": "minutes without utilization",
    "class_idle_minutes": "minutes classed idle",
    "class_bottlenecked_minutes": "minutes classed bottlenecked",
    "class_efficient_minutes": "minutes classed efficient",
    "class_inefficient_minutes": "minutes classed inefficient",
    "class_moderate_minutes": "minutes classed moderate",
    "avg_gpu_util_pct": "mean reported utilization, %",
    "avg_pif": "mean PIF",
    "avg_rfu_pct": "mean RFU, %",
    "avg_efficiency_gap_pct": "mean utilization - RFU, points",
    "avg_realized_tflops": "mean realized TFLOPS per GPU",
    "bottlenecked_day": ">= 60 active minutes and >= 50 % of them bottlenecked",
    "energy_wh": "energy the physical GPU drew in the minute, Wh: the energy counter's increase "
    "since the GPU's previous minute row (covering a gap), else mean power x 1 minute; null: "
    "neither",
    "energy_kwh": "energy drawn, kWh (the minutes' energy_wh summed); null: no energy reading",
    "idle_energy_kwh": "energy drawn in idle minutes, kWh; null: no energy reading",
    "gpus": "distinct physical GPUs",
    "gpu_minutes": "GPU-minutes in the group (a physical GPU counted once)",
    "pct_idle": "% of GPU-minutes idle",
    "pct_underutilized": "% of GPU-minutes underutilized",
    "pct_productive": "% of GPU-minutes productive",
    "pct_compute_bound": "% of GPU-minutes compute_bound",
    "pct_unknown": "% of GPU-minutes without utilization",
    "observed_gpu_minutes": "GPU-minutes with samples (a physical GPU counted once)",
    "expected_gpu_minutes": "GPUs seen x 1,440: the GPU-minutes of a fully covered day",
    "coverage_pct": "observed GPU-minutes / (GPUs seen x 1,440) x 100: how much of the day the data covers",
    # persistent bottlenecks
    "window_days": "days in the window D-6..D with data",
    "days_bottlenecked": "bottlenecked days in the window",
    "bottleneck_share": "bottlenecked / active minutes over the window",
    # money
    "gpu_hours": "GPU-hours paid for (physical GPUs x hours)",
    "unpriced_gpu_hours": "the part of gpu_hours on a model the price book lacks: no cost or "
    "waste is counted for it (null money, not $0)",
    "cost_usd": "what the GPU-hours cost at the price book; null: no minute has a price",
    "productive_usd": "cost of the work done (rfu share of non-idle minutes)",
    "idle_waste_usd": "cost of idle minutes",
    "stall_waste_usd": "cost of utilization that did no work (util - rfu)",
    "headroom_waste_usd": "cost of capacity neither used nor reported busy (100 - util)",
    "unmeasured_usd": "cost of minutes without utilization or RFU (not counted as waste)",
    "total_waste_usd": "idle + stall + headroom waste",
    "waste_frac": "total waste / cost (null without a cost)",
    "hourly_waste_usd": "total waste per GPU-hour",
    "monthly_waste_usd": "hourly waste x 24 x 30",
    "yearly_waste_usd": "hourly waste x 24 x 365",
    # recommendations
    "measured_waste_frac": "waste fraction measured for the namespace (the savings cap)",
    "actions": "recommended actions (SPEC vocabulary)",
    "action_details": "per action: fraction, overlap group, evidence, rationale",
    "naive_sum_frac": "sum of the action fractions (what stacking them naively would claim)",
    "utilization_savings_frac": "1 - prod(1 - f) over distinct overlap groups, capped by measured waste",
    "rate_savings_frac": "saving from the rate (spot vs on-demand)",
    "total_savings_frac": "1 - (1 - utilization) x (1 - rate)",
    "monthly_cost_usd": "the day's cost as a month (x 30); null: no price",
    "monthly_savings_usd": "monthly cost x total_savings_frac; null: no price",
    # health
    "hot_minutes": "minutes at or above the hot temperature (80 C)",
    "max_temp_c": "highest GPU temperature, C",
    "power_capped_minutes": "minutes with power-cap throttling",
    "xid_error_samples": "samples reporting an XID error",
    "xid_codes": "distinct XID codes seen",
    "ecc_dbe_errors": "double-bit ECC errors",
    "row_remap_failures": "row-remap failures",
    "status": "ok, warn (hot or XID) or drain (double-bit ECC or row-remap failure)",
    "reasons": "why the status is not ok",
    # stragglers
    "metric": "the metric compared with the pod's other GPUs",
    "value": "this GPU's hourly mean of the metric",
    "pod_median": "median of the pod's GPUs",
    "points_below": "points below the pod median",
    "pod_gpus": "GPUs in the pod",
    "pod_stddev": "standard deviation across the pod's GPUs",
    "rule": "the straggler rule that flagged it (points below median, or spread)",
    # ROI and namespaces
    "scope": "fleet or a GPU model",
    "target_rfu_pct": "RFU the ROI assumes reachable",
    "equivalent_gpus": "GPUs that reaching the target RFU would free",
    "monthly_value_usd": "monthly value of the freed GPUs",
    "pct_active_bottlenecked": "% of active minutes bottlenecked",
    "dominant_diagnosis": "most frequent diagnosis of the active minutes (at or above the idle threshold; idle time is pct_idle)",
    "waste_usd": "total waste",
    # workloads
    "workload": "the pod's owner (Deployment, StatefulSet, Job, CronJob: the pod name without "
    "the suffix Kubernetes generated); null: minutes without a pod",
    "pods": "distinct pods",
    "main_diagnosis": "diagnosis of most of the GPU-time (idle included, weighted by GPU share)",
    "top_action": "the action (SPEC vocabulary) recovering the most wasted GPU time, by the "
    "recommendation rules on the group's own numbers; null: none fires (spot is not one)",
    "energy_usd": "cost of the energy at the cluster's electricity rate; null: no energy reading",
    "co2_kg": "CO2 of the energy at the cluster's grid intensity, kg; null: no energy reading",
}

# where a name means something narrower in one table
BY_TABLE: dict[tuple[str, str], str] = {
    ("hourly_fleet_metrics", "gpus"): "distinct physical GPUs with samples in the hour",
    ("fleet_daily", "gpus"): "distinct physical GPUs seen on the day (a MIG GPU once)",
    (
        "gpu_daily",
        "coverage_pct",
    ): "minutes / 1,440 x 100: how much of the day the GPU's data covers",
    ("efficiency_roi", "gpus"): "physical GPUs valued in the scope: those with an RFU and a price",
    ("gpu_health", "minutes"): "minutes with samples",
    ("stragglers", "hour"): "UTC hour the GPU lagged its pod",
    ("efficiency_roi", "avg_rfu_pct"): "mean RFU of the scope, %",
    ("workload_efficiency", "gpus"): "distinct physical GPUs the workload ran on",
    ("workload_efficiency", "gpu_hours"): "GPU-hours paid for (a MIG instance: its slices' share)",
    ("namespace_monthly", "date"): "first UTC day of the month (the partition)",
    ("namespace_monthly", "avg_rfu_pct"): "mean RFU over the month's GPU-hours that have one "
    "(a power reading and a max power), %",
    ("namespace_monthly", "energy_kwh"): "energy drawn over the month, kWh (a MIG instance: its "
    "slices' share); null: no energy reading",
}


def _field_description(column: str) -> str | None:
    for f in FIELDS:
        if f.column == column:
            return f"{f.names[0].upper()} ({f.unit}), mean of the samples"
    return None


def describe(table: str, column: str) -> str | None:
    """The column's meaning in `table`, or None if nobody wrote one (a test forbids that)."""
    if (table, column) in BY_TABLE:
        return BY_TABLE[(table, column)]
    if table == "gpu_samples" and (d := _field_description(column)):
        return d.removesuffix(", mean of the samples")
    return COLUMNS.get(column) or _field_description(column)
