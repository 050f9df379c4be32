"""Dagster entry point (`workspace.yaml` loads this module)."""

import dagster as dg

from gpu_pipeline import settings
from gpu_pipeline.defs import marts, raw, report, staging, warehouse
from gpu_pipeline.defs.jobs import daily_pipeline, daily_schedule
from gpu_pipeline.defs.resources import LakeResource, LandingResource, ReferenceResource
from gpu_pipeline.defs.sensors import freshness_checks, freshness_sensor, landing_zone_sensor


def build_definitions() -> dg.Definitions:
    """Definitions bound to the current environment (GPU_PIPELINE_* variables or defaults)."""
    return dg.Definitions(
        assets=dg.load_assets_from_modules([raw, staging, marts, report, warehouse]),
        asset_checks=freshness_checks,
        jobs=[daily_pipeline, warehouse.refresh_warehouse],
        schedules=[daily_schedule],
        sensors=[landing_zone_sensor, freshness_sensor],
        # each step of a run in its own process, two at a time (2 cores); the run queue in
        # config/dagster.yaml limits how many runs a backfill has going at once
        executor=dg.multiprocess_executor.configured({"max_concurrent": 2}),
        resources={
            "lake": LakeResource(root=settings.lake_root()),
            "landing": LandingResource(root=settings.raw_root()),
            "reference": ReferenceResource(
                prices=settings.prices_path(), catalog=settings.catalog_path()
            ),
        },
    )


defs = build_definitions()
