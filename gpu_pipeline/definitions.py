"""Dagster entry point (`workspace.yaml` loads this module)."""

from gpu_pipeline.settings import Settings, SettingsError

# Every GPU_PIPELINE_* variable is checked before anything reads one: a value that is not
# allowed fails the code location's load (`dagster dev`, `dg dev`, `dg check defs`, a run's own
# process) with one line per variable, naming it, its value and what is allowed, raised here so
# that the error's stack is this one line and not the import chain of the first module to read it
try:
    Settings.from_env()
except SettingsError as e:
    raise SettingsError(e.lines) from None

import dagster as dg

from gpu_pipeline.defs import marts, report, staging, warehouse
from gpu_pipeline.defs.jobs import daily_pipeline, daily_schedule
from gpu_pipeline.defs.pull import prometheus_export
from gpu_pipeline.defs.raw import build_ingest, ingest
from gpu_pipeline.defs.resources import (
    LakeResource,
    LandingResource,
    PromResource,
    ReferenceResource,
)
from gpu_pipeline.defs.sensors import (
    freshness_checks,
    freshness_sensor,
    landing_files,
    landing_zone_sensor,
)
from gpu_pipeline.settings import ENV_VARS, PROM_SETTINGS

EXECUTORS = ("in_process", "multiprocess", "k8s")


def executor(kind: str) -> dg.ExecutorDefinition:
    """Where a run's steps execute (GPU_PIPELINE_EXECUTOR).

    `in_process` (default): every step in the run's own process. A day's steps are small next to
    the cost of starting a Python process with Polars and Dagster (~2-4 s a step, ~25 s a run on
    2 cores), and Polars already uses every core inside a step. `multiprocess`: each step in its
    own process, two at a time. `k8s`: each step in its own pod (`deploy/k8s/run_config.yaml`).
    """
    if kind not in EXECUTORS:
        raise ValueError(
            f"GPU_PIPELINE_EXECUTOR must be one of {', '.join(EXECUTORS)}, not {kind!r}"
        )
    if kind == "multiprocess":
        return dg.multiprocess_executor.configured({"max_concurrent": 2})
    if kind == "k8s":
        from dagster_k8s import k8s_job_executor

        return k8s_job_executor
    return dg.in_process_executor


def _bind(s: Settings, name: str) -> object:
    """A setting for a resource: `dg.EnvVar` when its variable set it (the UI shows the variable,
    and a run resolves it in its own process), else the value itself."""
    value = getattr(s, name)
    if name not in s.from_env_fields:
        return value
    var = ENV_VARS[name]
    return dg.EnvVar.int(var) if isinstance(value, int) else dg.EnvVar(var)


def prometheus(s: Settings, enabled: bool | None = None) -> dict:
    """The pull's resource bound to the GPU_PIPELINE_PROM_* variables that are set (the URL may
    come from a CLI flag), or {} when no server is configured (then the graph reads files only)."""
    if enabled is False or not s.prom_url:
        return {}
    bound = {
        name: (
            value
            if f"prom.{name}" not in s.from_env_fields or kind is bool
            else dg.EnvVar.int(var)
            if kind is int
            else dg.EnvVar(var)
        )
        for name, value in s.prom.items()
        for var, kind in [PROM_SETTINGS[name]]
    }
    return {"prometheus": PromResource(**bound)}


def build_definitions(s: Settings | None = None, pull: bool | None = None) -> dg.Definitions:
    """Definitions bound to `s` (default: this process's GPU_PIPELINE_* variables).
    `pull=False` leaves the Prometheus pull out even when a server is configured."""
    s = s or Settings.from_env()
    prom = prometheus(s, pull)
    assets = dg.load_assets_from_modules([staging, marts, report, warehouse])
    if prom:  # the pull lands files before the ingest reads them
        assets += [prometheus_export, build_ingest(("prometheus_export",))]
    else:
        assets += [ingest]
    return dg.Definitions(
        assets=[landing_files, *assets],
        asset_checks=freshness_checks,
        jobs=[daily_pipeline, warehouse.refresh_warehouse],
        schedules=[daily_schedule],
        sensors=[landing_zone_sensor, freshness_sensor],
        # the run queue in config/dagster.yaml limits how many runs a backfill has going at once
        executor=executor(s.executor),
        resources={
            "lake": LakeResource(
                root=_bind(s, "lake"),
                cache=_bind(s, "cache"),
                chunk_mb=_bind(s, "chunk_mb"),
                chunk_gpus=_bind(s, "chunk_gpus"),
                split=_bind(s, "split"),
            ),
            "landing": LandingResource(
                root=_bind(s, "raw"),
                csv_timezone=_bind(s, "csv_timezone"),
                max_file_mb=_bind(s, "max_file_mb"),
            ),
            "reference": ReferenceResource(
                prices=_bind(s, "prices"),
                catalog=_bind(s, "catalog"),
                rules=_bind(s, "rules"),
                energy=_bind(s, "energy"),
            ),
            **prom,
        },
    )


defs = build_definitions()
