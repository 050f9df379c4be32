"""The DuckDB views file: written by this one unpartitioned asset only.

Views glob the lake at query time, so the file needs writing once per lake, not per partition;
keeping it out of partitioned runs means parallel backfills never contend for DuckDB's one writer.
A lake in an object store has no views file (DuckDB cannot read the store here): the asset
writes none, removes one an earlier version left (its views were all empty), and says in its
metadata how to read that lake instead.
"""

import dagster as dg

from gpu_pipeline import settings
from gpu_pipeline.defs.resources import LakeResource
from gpu_pipeline.lib.schemas import TABLES


# lineage only: the views read every table (all their partitions, at query time); nothing here
# runs when a table does
@dg.asset(group_name="warehouse", deps=list(TABLES))
def warehouse_views(context: dg.AssetExecutionContext, lake: LakeResource):
    """DuckDB file of views over every lake table (`sql/views.sql`); analysts open it read-only.
    A local lake only: for one in an object store, no file, and the metadata says why and how to
    read it."""
    # DuckDB is imported here, not as the definitions load: its ~20 MiB are not held through a
    # day's steps (the 10,000-GPU day's peak is the staging step's; benchmarks/README.md)
    from gpu_pipeline.lib.io import warehouse

    if warehouse.is_object_store(lake.root):
        note = warehouse.object_store_note(lake.root)
        stale = settings.warehouse_path(lake.root)
        if warehouse.remove_views_file(stale):
            context.log.info(f"removed {stale}: an earlier version's views file of empty views")
        context.log.info(note)
        return dg.MaterializeResult(
            metadata={"views_file": "none: the views file serves local lakes", "note": note}
        )
    path = warehouse.build_views_file(lake.root, settings.warehouse_path(lake.root))
    return dg.MaterializeResult(metadata={"dagster/uri": dg.MetadataValue.path(str(path))})


refresh_warehouse = dg.define_asset_job("refresh_warehouse", selection=[warehouse_views])
