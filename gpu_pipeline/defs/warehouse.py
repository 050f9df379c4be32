"""The DuckDB views file: written by this one unpartitioned asset only.

Views glob the lake at query time, so the file needs writing once per lake, not per partition;
keeping it out of partitioned runs means parallel backfills never contend for DuckDB's one writer.
"""

import dagster as dg

from gpu_pipeline import settings
from gpu_pipeline.defs.resources import LakeResource
from gpu_pipeline.lib.schemas import TABLES


# lineage only: the views read every table (all their partitions, at query time); nothing here
# runs when a table does
@dg.asset(group_name="warehouse", deps=list(TABLES))
def warehouse_views(lake: LakeResource):
    """DuckDB file of views over every lake table (`sql/views.sql`); analysts open it read-only."""
    # DuckDB is imported here, not as the definitions load: its ~20 MiB are not held through a
    # day's steps (the 10,000-GPU day's peak is the staging step's; benchmarks/README.md)
    from gpu_pipeline.lib.io.warehouse import build_views_file

    path = build_views_file(lake.root, settings.warehouse_path(lake.root))
    return dg.MaterializeResult(metadata={"dagster/uri": dg.MetadataValue.path(str(path))})


refresh_warehouse = dg.define_asset_job("refresh_warehouse", selection=[warehouse_views])
