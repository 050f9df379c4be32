"""Dagster entry point (`workspace.yaml` loads this module)."""

import dagster as dg

from gpu_pipeline import settings
from gpu_pipeline.defs import marts, raw, report, staging
from gpu_pipeline.defs.jobs import daily_pipeline, daily_schedule
from gpu_pipeline.defs.resources import LakeResource, LandingResource, ReferenceResource


def build_definitions() -> dg.Definitions:
    """Definitions bound to the current environment (GPU_PIPELINE_* variables or defaults)."""
    return dg.Definitions(
        assets=dg.load_assets_from_modules([raw, staging, marts, report]),
        jobs=[daily_pipeline],
        schedules=[daily_schedule],
        resources={
            "lake": LakeResource(root=settings.lake_root()),
            "landing": LandingResource(root=settings.raw_root()),
            "reference": ReferenceResource(
                prices=settings.prices_path(), catalog=settings.catalog_path()
            ),
        },
    )


defs = build_definitions()
