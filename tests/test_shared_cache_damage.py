"""A damaged, partial or forged copy of a parse in the object store (lib/ingest/shared_cache.py)
means a local parse, never a failed run: a file missing from the copy, a meta.json with a field
of the wrong kind, one naming a file it records no hash of."""

import json
from datetime import date, timedelta

import dagster as dg
import polars as pl
import pyarrow.fs as pafs
import pytest
from helpers import MODELS, expo_lines, write_file

from gpu_pipeline.lib.ingest.cache import load_or_parse, parse_all
from gpu_pipeline.lib.ingest.landing import list_landing
from gpu_pipeline.lib.ingest.shared_cache import SharedCache

D = date(2024, 1, 1)


def _land(raw, days):
    for d in days:
        lines = expo_lines("GPU-a", MODELS["A100"], "n1", "team", d, range(30), 70, 250.0)
        # a line rejected: each parse's quarantine has a record
        write_file(raw / f"n1_{d}.prom", [*lines, "DCGM_FI_DEV_GPU_UTIL{broken 1"])
    return list_landing(raw)


def _frames(pf) -> tuple:
    return (
        pf.samples.collect().sort("timestamp"),
        pf.quarantine.collect(),
        pf.home_day,
        pf.days,
        pf.rows_by_day,
        pf.records_by_day,
    )


def _equal(a, b) -> bool:
    return all(
        x.equals(y) if isinstance(x, pl.DataFrame) else x == y for x, y in zip(a, b, strict=True)
    )


def test_a_copy_missing_its_quarantine_is_parsed_here_for_any_day(tmp_path):
    """The copy of another day's parse lost its quarantine file in the store: a fresh machine's
    run (which reads every parse's quarantine) parses that file here, and uploads it whole."""
    files = _land(tmp_path / "raw", [D, D + timedelta(days=1)])
    store_root = tmp_path / "store"
    store = SharedCache(pafs.LocalFileSystem(), str(store_root))
    first = parse_all(files, tmp_path / "a", shared=store)
    later = next(
        p
        for p in store_root.iterdir()
        if D.isoformat() not in json.loads((p / "meta.json").read_text())["days"]
    )
    (later / "quarantine-00000.parquet").unlink()
    fresh = parse_all(files, tmp_path / "b", days=[D], shared=store)
    for a, b in zip(first, fresh, strict=True):
        assert b.quarantine.collect().height == 1  # the rejected line, read from local disk
        assert _equal(_frames(a)[1:], _frames(b)[1:])
    assert (later / "quarantine-00000.parquet").is_file()  # the copy is whole again


def _forge(meta: dict, how: str) -> dict | str:
    if how == "home_day_a_time":
        return {**meta, "home_day": f"{meta['home_day']}T00:00:00"}
    if how == "day_not_iso":
        return {**meta, "days": [d.replace("-", "") for d in meta["days"]]}
    if how == "count_a_string":
        return {**meta, "rows_by_day": {d: str(n) for d, n in meta["rows_by_day"].items()}}
    if how == "count_negative":
        return {**meta, "lines_total": -1}
    if how == "quarantine_not_hashed":  # a file the hashes do not cover: read unchecked
        return {**meta, "quarantine": [*meta["quarantine"], "quarantine-00001.parquet"]}
    if how == "not_an_object":
        return "[1, 2]"
    return '{"format": "prometheus"'  # cut short


FORGED = [
    "home_day_a_time",
    "day_not_iso",
    "count_a_string",
    "count_negative",
    "quarantine_not_hashed",
    "not_an_object",
    "cut_short",
]


@pytest.mark.parametrize("how", FORGED)
@pytest.mark.parametrize("day", [D, date(2030, 1, 1)], ids=["its_day", "other_day"])
def test_a_meta_json_not_as_written_means_a_local_parse(tmp_path, how, day):
    """A copy whose meta.json is valid JSON with a field of the wrong kind (or not JSON, or
    naming a file it has no hash of) is parsed again on the fresh machine: the same parse as
    a clean one, and the copy replaced."""
    (f,) = _land(tmp_path / "raw", [D])
    store = SharedCache(pafs.LocalFileSystem(), str(tmp_path / "store"))
    clean = load_or_parse(f, tmp_path / "a", shared=store)
    (key,) = [p.name for p in (tmp_path / "store").iterdir()]
    meta_path = tmp_path / "store" / key / "meta.json"
    good = json.loads(meta_path.read_text())
    forged = _forge(good, how)
    meta_path.write_text(forged if isinstance(forged, str) else json.dumps(forged))
    fresh = load_or_parse(f, tmp_path / "b", days=[day], shared=store)
    assert fresh.home_day == D and fresh.days == [D] and fresh.rows_by_day == {D: 60}
    assert _equal(_frames(fresh), _frames(clean))
    assert json.loads((tmp_path / "b" / key / "meta.json").read_text()) == good
    assert json.loads(meta_path.read_text()) == good  # uploaded over the forged one


def test_a_local_meta_json_damaged_on_disk_means_a_parse(tmp_path):
    (f,) = _land(tmp_path / "raw", [D])
    clean = load_or_parse(f, tmp_path / "a")
    (meta_path,) = (tmp_path / "a").glob("*/meta.json")
    good = meta_path.read_text()
    meta_path.write_text(good[:40])
    again = load_or_parse(f, tmp_path / "a", days=[D])
    assert _equal(_frames(again), _frames(clean)) and meta_path.read_text() == good


pytest.importorskip("moto.server")

from test_object_store import s3  # noqa: E402,F401 - the moto server fixture

from gpu_pipeline.defs import raw  # noqa: E402
from gpu_pipeline.defs.resources import LakeResource, LandingResource  # noqa: E402


def test_a_fresh_machine_runs_every_day_with_a_copy_missing_a_file(s3, tmp_path):  # noqa: F811
    """The reported case: `<lake>/_ingest_cache/<key>/quarantine-00000.parquet` deleted from
    the store made every run on a fresh machine fail, for every day. Now the day runs, and its
    tables are those of the machine that parsed first."""
    import boto3

    _land(tmp_path / "raw", [D, D + timedelta(days=1)])
    uri = f"{s3}-{tmp_path.name[:30]}"  # moto's store is the process's: a prefix of its own
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")

    def run(machine: str, day: date) -> pl.DataFrame:
        res = dg.materialize(
            dg.load_assets_from_modules([raw]),
            partition_key=day.isoformat(),
            resources={
                "lake": LakeResource(root=uri, cache=str(tmp_path / machine)),
                "landing": LandingResource(root=str(tmp_path / "raw")),
            },
            instance=dg.DagsterInstance.ephemeral(),
        )
        assert res.success
        from gpu_pipeline.lib.io.lake import Lake

        return Lake(uri, cache=tmp_path / "reader").read("ingest_log", day)

    before = run("a", D)
    client = boto3.client("s3")
    listed = client.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/_ingest_cache/")
    quarantines = sorted(o["Key"] for o in listed["Contents"] if "/quarantine-" in o["Key"])
    assert len(quarantines) == 2
    for key in quarantines:  # the other day's and the day's own
        client.delete_object(Bucket=bucket, Key=key)
    after = run("b", D)
    ledger = ["source_file", "sha256", "rows_read", "rows_accepted", "rows_quarantined"]
    assert after.select(ledger).equals(before.select(ledger))
    assert after["rows_quarantined"].to_list() == [1] and after["rows_accepted"].to_list() == [60]
    assert run("c", D + timedelta(days=1))["rows_accepted"].to_list() == [60]
