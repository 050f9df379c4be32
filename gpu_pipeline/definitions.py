"""Dagster entry point (`workspace.yaml` loads this module)."""

import dagster as dg

from gpu_pipeline import settings
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

EXECUTORS = ("in_process", "multiprocess", "k8s")


def executor() -> dg.ExecutorDefinition:
    """Where a run's steps execute (GPU_PIPELINE_EXECUTOR).

    `in_process` (default): every step in the run's own process. A day's steps are small next to
    the cost of starting a Python process with Polars and Dagster (~2-4 s a step, ~25 s a run on
    2 cores), and Polars already uses every core inside a step. `multiprocess`: each step in its
    own process, two at a time. `k8s`: each step in its own pod (`deploy/k8s/run_config.yaml`).
    """
    kind = settings.executor()
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


def prometheus(enabled: bool | None = None) -> dict:
    """The pull's resource bound to the GPU_PIPELINE_PROM_* variables that are set, or {} when
    no server is configured (then the graph reads files only, as without it)."""
    if enabled is False or not settings.prom_url():
        return {}
    bound = {
        name: (dg.EnvVar(var) if kind is str else dg.EnvVar.int(var) if kind is int else value)
        for name, value in settings.prom_settings().items()
        for var, kind in [settings.PROM_SETTINGS[name]]
    }
    return {"prometheus": PromResource(**bound)}


def build_definitions(pull: bool | None = None) -> dg.Definitions:
    """Definitions bound to the current environment (GPU_PIPELINE_* variables or defaults).
    `pull=False` leaves the Prometheus pull out even when a server is configured."""
    pull = prometheus(pull)
    assets = dg.load_assets_from_modules([staging, marts, report, warehouse])
    if pull:  # the pull lands files before the ingest reads them
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
        executor=executor(),
        resources={
            "lake": LakeResource(root=settings.lake_root()),
            "landing": LandingResource(root=settings.raw_root()),
            "reference": ReferenceResource(
                prices=settings.prices_path(),
                catalog=settings.catalog_path(),
                rules=settings.rules_path(),
                energy=settings.energy_path(),
            ),
            **pull,
        },
    )


defs = build_definitions()
