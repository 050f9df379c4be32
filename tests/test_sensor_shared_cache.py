"""The landing-zone sensor beside a lake in an object store, as on Kubernetes: the code server
(which evaluates the sensor) and each run pod have a parse cache of their own on local disk;
what a run parsed reaches the sensor through the cache's copy in the store."""

import json
from datetime import date, timedelta

import dagster as dg
import pytest

pytest.importorskip("moto.server")

from test_object_store import s3  # noqa: E402,F401 - the moto server fixture
from test_operations import backfill_plan, plant_day  # noqa: E402

from gpu_pipeline.definitions import defs  # noqa: E402
from gpu_pipeline.defs.resources import LakeResource, LandingResource, ReferenceResource  # noqa: E402
from gpu_pipeline.defs.sensors import landing_files, landing_zone_sensor  # noqa: E402

D = date(2024, 1, 10)


def test_the_sensor_plans_from_what_run_pods_parsed(s3, tmp_path):  # noqa: F811
    """The tick after the parse run plans the backfill (it asked for the same parse run every
    tick, a run key the daemon skips, and new files were never backfilled); the code server
    downloads no samples and parses nothing."""
    uri = f"{s3}-{tmp_path.name[:30]}"  # moto's store is the process's: a prefix of its own
    raw = tmp_path / "raw"
    plant_day(raw, D)
    plant_day(raw, D + timedelta(days=1))
    instance = dg.DagsterInstance.ephemeral()

    def resources(machine: str) -> dict:
        return {
            "lake": LakeResource(root=uri, cache=str(tmp_path / machine)),
            "landing": LandingResource(root=str(raw)),
            "reference": ReferenceResource(),
        }

    def tick(cursor):
        with dg.build_sensor_context(
            cursor=cursor, resources=resources("codeserver"), instance=instance, definitions=defs
        ) as ctx:
            return landing_zone_sensor(ctx)

    def parse_run(pod: str) -> None:
        assert dg.materialize([landing_files], resources=resources(pod), instance=instance).success

    first = tick(None)
    (req,) = first.run_requests
    assert req.asset_selection == [landing_files.key] and req.run_key.startswith("parse:")
    parse_run("runpod1")
    planned = tick(None)
    (backfill,) = planned.run_requests
    assert backfill.run_key != req.run_key  # not the same parse run again
    assert backfill_plan(planned)["gpu_samples"] == ["2024-01-10", "2024-01-11"]
    assert sorted(json.loads(planned.cursor)) == [
        "c1/n1_2024-01-10.prom",
        "c1/n1_2024-01-11.prom",
    ]
    code_server = tmp_path / "codeserver"
    assert len(list(code_server.glob("*/meta.json"))) == 2  # each parse's meta.json …
    assert not list(code_server.glob("*/samples-*.parquet"))  # … not its samples
    # a late file, parsed by another pod: backfilled in turn
    plant_day(raw, D - timedelta(days=3), name="late_2024-01-07.prom")
    parse = tick(planned.cursor).run_requests[0]
    assert parse.asset_selection == [landing_files.key] and parse.run_key != req.run_key
    parse_run("runpod2")
    assert backfill_plan(tick(planned.cursor))["gpu_samples"] == ["2024-01-07"]
