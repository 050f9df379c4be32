"""The telemetry fields gpu_pipeline understands: canonical column, source names, units, valid range.

One table drives the exposition parser (which names map to which column), the row-level range
checks (which values are impossible and go to quarantine) and the pandera model of `gpu_samples`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

# DCGM "blank" sentinels: values at or just below the top of the int32/int64 ranges and the 2^47
# family of the fp64 blanks. They mean "no value" and become nulls.
INT32_BLANK_FROM = 2147483632.0  # 0x7ffffff0 .. 0x7fffffff
INT32_BLANK_TO = 2147483647.0
FP64_BLANK_FROM = 140737488355328.0  # 2^47 .. 2^47 + 16
FP64_BLANK_TO = 140737488355344.0
INT64_BLANK_FROM = 9223372036854775792.0  # 0x7ffffffffffffff0 .. 0x7fffffffffffffff
INT64_BLANK_TO = 9223372036854775808.0  # as float64 the family rounds to 2^63


@dataclass(frozen=True)
class Field:
    column: str
    names: tuple[str, ...]  # exposition metric names, lower-cased (DCGM_FI_*, old dcgm_*)
    unit: str
    lo: float | None = None  # inclusive valid range after unit normalization
    hi: float | None = None
    # DCGM 4.7 renamed fields, some in new units: (lower-cased name, factor to reach `unit`)
    renamed: tuple[tuple[str, float], ...] = ()
    # a property of the physical GPU that dcgm-exporter repeats on every MIG instance
    device_level: bool = False


def _dcgm(*suffixes: str, old: tuple[str, ...] = ()) -> tuple[str, ...]:
    """DCGM_FI_<suffix> names, plus dcgm-exporter 1.x `dcgm_*` names (derived, and `old` extras)."""
    out: list[str] = []
    for s in suffixes:
        out += [f"dcgm_fi_{s}", f"dcgm_{s.removeprefix('dev_').removeprefix('prof_')}"]
    out += [f"dcgm_{o}" for o in old]
    return tuple(dict.fromkeys(n.lower() for n in out))


def _new(*pairs: tuple[str, float]) -> tuple[tuple[str, float], ...]:
    return tuple((f"dcgm_fi_{n}", k) for n, k in pairs)


MIB = 1 / 2**20
F = Field
FIELDS: tuple[Field, ...] = (
    F(
        "gpu_util_pct",
        _dcgm("dev_gpu_util", old=("gpu_utilization",)),
        "%",
        0,
        100,
        _new(("dev_gpu_util_ratio", 100.0)),
    ),
    F(
        "mem_copy_util_pct",
        _dcgm("dev_mem_copy_util", old=("mem_copy_utilization",)),
        "%",
        0,
        100,
        _new(("dev_memory_util_ratio", 100.0)),
    ),
    F(
        "enc_util_pct",
        _dcgm("dev_enc_util", old=("enc_utilization",)),
        "%",
        0,
        100,
        _new(("dev_enc_util_ratio", 100.0)),
    ),
    F(
        "dec_util_pct",
        _dcgm("dev_dec_util", old=("dec_utilization",)),
        "%",
        0,
        100,
        _new(("dev_dec_util_ratio", 100.0)),
    ),
    F(
        "power_w",
        _dcgm("dev_power_usage"),
        "W",
        0,
        5000,
        _new(("dev_board_power_watts", 1.0)),
        True,
    ),
    F(
        "power_limit_w",
        _dcgm("dev_power_mgmt_limit", "dev_enforced_power_limit"),
        "W",
        0,
        5000,
        (),
        True,
    ),
    F(
        "energy_mj",
        _dcgm("dev_total_energy_consumption"),
        "mJ",
        0,
        None,
        _new(("dev_gpu_energy_joules_total", 1000.0)),
        True,
    ),
    F(
        "gpu_temp_c",
        _dcgm("dev_gpu_temp"),
        "C",
        -50,
        150,
        _new(("dev_gpu_temp_celsius", 1.0)),
        True,
    ),
    F(
        "mem_temp_c",
        _dcgm("dev_memory_temp"),
        "C",
        -50,
        150,
        _new(("dev_memory_temp_celsius", 1.0)),
        True,
    ),
    F(
        "sm_clock_mhz",
        _dcgm("dev_sm_clock"),
        "MHz",
        0,
        10000,
        _new(("dev_sm_clock_hertz", 1e-6)),
        True,
    ),
    F(
        "mem_clock_mhz",
        _dcgm("dev_mem_clock", old=("memory_clock",)),
        "MHz",
        0,
        50000,
        _new(("dev_memory_clock_hertz", 1e-6)),
        True,
    ),
    F("fb_used_mib", _dcgm("dev_fb_used"), "MiB", 0, None, _new(("dev_fb_used_bytes", MIB))),
    F("fb_free_mib", _dcgm("dev_fb_free"), "MiB", 0, None, _new(("dev_fb_free_bytes", MIB))),
    F(
        "fb_reserved_mib",
        _dcgm("dev_fb_reserved"),
        "MiB",
        0,
        None,
        _new(("dev_fb_reserved_bytes", MIB)),
    ),
    F(
        "pcie_replay_count",
        _dcgm("dev_pcie_replay_counter"),
        "count",
        0,
        None,
        _new(("dev_pcie_replay_total", 1.0)),
        True,
    ),
    F("xid_errors", _dcgm("dev_xid_errors"), "code", 0, None, _new(("dev_xid_error", 1.0)), True),
    F("ecc_sbe_volatile", _dcgm("dev_ecc_sbe_vol_total"), "count", 0, None, (), True),
    F("ecc_dbe_volatile", _dcgm("dev_ecc_dbe_vol_total"), "count", 0, None, (), True),
    F(
        "remapped_rows_correctable",
        _dcgm("dev_correctable_remapped_rows"),
        "count",
        0,
        None,
        _new(("dev_row_remap_correctable_total", 1.0)),
        True,
    ),
    F(
        "remapped_rows_uncorrectable",
        _dcgm("dev_uncorrectable_remapped_rows"),
        "count",
        0,
        None,
        _new(("dev_row_remap_uncorrectable_total", 1.0)),
        True,
    ),
    F(
        "row_remap_failure",
        _dcgm("dev_row_remap_failure"),
        "flag",
        0,
        1,
        _new(("dev_row_remap_failed", 1.0)),
        True,
    ),
    # DCGM reports constrained time in ns; 4.7 adds base-unit seconds
    F(
        "power_violation_ns",
        _dcgm("dev_power_violation"),
        "ns",
        0,
        None,
        _new(("dev_gpu_power_throttle_seconds_total", 1e9)),
        True,
    ),
    F(
        "thermal_violation_ns",
        _dcgm("dev_thermal_violation"),
        "ns",
        0,
        None,
        _new(("dev_gpu_thermal_throttle_seconds_total", 1e9)),
        True,
    ),
    F(
        "clock_event_reasons",
        _dcgm("dev_clock_throttle_reasons", "dev_clocks_event_reasons"),
        "bitmask",
        0,
        None,
        (),
        True,
    ),
    F("vgpu_license_status", _dcgm("dev_vgpu_license_status"), "code", 0, None),
    F(
        "nvlink_bandwidth_total",
        _dcgm("dev_nvlink_bandwidth_total"),
        "MB/s",
        0,
        None,
        _new(
            ("dev_nvlink_throughput_total", 1.0), ("dev_nvlink_throughput_bytes_per_second", 1e-6)
        ),
        True,
    ),
    # DCGM profiling ratios (0..1); a little slack above 1 is measurement noise, far above is bad data
    F(
        "prof_gr_engine_active",
        _dcgm("prof_gr_engine_active"),
        "ratio",
        0,
        1.05,
        _new(("prof_gr_engine_util_ratio", 1.0)),
    ),
    F(
        "prof_sm_active",
        _dcgm("prof_sm_active"),
        "ratio",
        0,
        1.05,
        _new(("prof_sm_util_ratio", 1.0)),
    ),
    F(
        "prof_sm_occupancy",
        _dcgm("prof_sm_occupancy"),
        "ratio",
        0,
        1.05,
        _new(("prof_sm_occupancy_ratio", 1.0)),
    ),
    F(
        "prof_pipe_tensor_active",
        _dcgm("prof_pipe_tensor_active"),
        "ratio",
        0,
        1.05,
        _new(("prof_tensor_util_ratio", 1.0)),
    ),
    F(
        "prof_pipe_fp64_active",
        _dcgm("prof_pipe_fp64_active"),
        "ratio",
        0,
        1.05,
        _new(("prof_fp64_util_ratio", 1.0)),
    ),
    F(
        "prof_pipe_fp32_active",
        _dcgm("prof_pipe_fp32_active"),
        "ratio",
        0,
        1.05,
        _new(("prof_fp32_util_ratio", 1.0)),
    ),
    F("prof_pipe_fp16_active", _dcgm("prof_pipe_fp16_active"), "ratio", 0, 1.05),
    F(
        "prof_dram_active",
        _dcgm("prof_dram_active"),
        "ratio",
        0,
        1.05,
        _new(("prof_dram_util_ratio", 1.0)),
    ),
    F("pcie_tx_bytes_per_s", _dcgm("prof_pcie_tx_bytes"), "B/s", 0, None),
    F("pcie_rx_bytes_per_s", _dcgm("prof_pcie_rx_bytes"), "B/s", 0, None),
    F("nvlink_tx_bytes_per_s", _dcgm("prof_nvlink_tx_bytes"), "B/s", 0, None),
    F("nvlink_rx_bytes_per_s", _dcgm("prof_nvlink_rx_bytes"), "B/s", 0, None),
)

# Fields with no natural maximum still have a physical one: far beyond any real reading, so that
# 1e300 or +Inf is an impossible value (quarantined), like -Inf, never a number in a mart
UNIT_CEILINGS = {
    "mJ": 1e18,  # 10^15 J: a GPU at 1 kW for 30,000 years
    "MiB": 1e8,  # 100 TiB of framebuffer
    "count": 1e15,
    "code": 1e6,
    "ns": 1e19,  # 300 years of throttled time
    "bitmask": 2.0**64,
    "MB/s": 1e9,
    "B/s": 1e14,
}
FIELDS = tuple(
    replace(f, hi=UNIT_CEILINGS[f.unit]) if f.hi is None and f.unit in UNIT_CEILINGS else f
    for f in FIELDS
)
assert all(f.hi is not None for f in FIELDS), "every field needs an upper bound"

FIELD_COLUMNS: tuple[str, ...] = tuple(f.column for f in FIELDS)
BY_COLUMN: dict[str, Field] = {f.column: f for f in FIELDS}
METRIC_TO_COLUMN: dict[str, str] = {
    **{n: f.column for f in FIELDS for n in f.names},
    **{n: f.column for f in FIELDS for n, _ in f.renamed},
}
# factor from a source metric's unit to its column's unit, where it is not 1
METRIC_SCALE: dict[str, float] = {n: k for f in FIELDS for n, k in f.renamed if k != 1.0}
DEVICE_LEVEL_COLUMNS: frozenset[str] = frozenset(f.column for f in FIELDS if f.device_level)

# Identity and attribution columns of a sample, in contract order.
ID_COLUMNS: tuple[str, ...] = (
    "timestamp",
    "gpu_uuid",
    "gpu_instance_id",
    "gpu_instance_profile",
    "gpu_index",
    "pci_bus_id",
    "hostname",
    "cluster",
    "namespace",
    "pod",
    "container",
    "hpc_job",
    "gpu_model",
    "driver_version",
)
# the columns that say which workload used the GPU (not the device): a MIG GPU's device-level
# fields carry none of them, and an exporter's own pod labels are not the workload's
WORKLOAD_COLUMNS: tuple[str, ...] = ("namespace", "pod", "container", "hpc_job")

# Exposition label names (lower-cased) -> attribute column. Earlier names win when several appear:
# `exported_*` comes first because a scrape that did not honour labels moved the workload's there.
LABEL_ALIASES: dict[str, tuple[str, ...]] = {
    "gpu_uuid": ("uuid",),
    "gpu_index": ("gpu", "minor_number"),
    "pci_bus_id": ("pci_bus_id", "pcibusid", "bus_id", "busid"),
    "gpu_model": ("modelname", "model_name"),
    # `instance` (the scrape target Prometheus adds) last: without a host label it still tells
    # GPU 0 of one target from GPU 0 of another (adversarial review: they were merged)
    "hostname": ("hostname", "host", "node", "kubernetes_node", "instance"),
    "cluster": ("cluster", "cluster_name", "kubernetes_cluster"),
    "namespace": ("exported_namespace", "namespace"),
    "pod": ("exported_pod", "pod"),
    "container": ("exported_container", "container"),
    # dcgm-exporter's HPC job mapping (`--hpc-job-mapping-dir`: Slurm's job id on its GPUs)
    "hpc_job": ("hpc_job",),
    "gpu_instance_id": ("gpu_i_id",),
    "gpu_instance_profile": ("gpu_i_profile",),
    "driver_version": ("dcgm_fi_driver_version", "dcgm_fi_system_driver_version", "driver_version"),
}
