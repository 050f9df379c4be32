"""An object-store landing zone's mirror (lib/ingest/remote.py) on the moto server: an object a
local folder cannot hold is skipped with why and the run goes on; whatever an earlier run left,
the mirror is what the store lists."""

import shutil
from datetime import date

import dagster as dg
import polars as pl
import pytest
from helpers import MODELS, expo_lines

pytest.importorskip("moto.server")

from test_object_store import s3  # noqa: E402,F401 - the moto server fixture

from gpu_pipeline.defs import raw  # noqa: E402
from gpu_pipeline.defs.resources import LakeResource, LandingResource  # noqa: E402
from gpu_pipeline.lib.ingest import remote  # noqa: E402
from gpu_pipeline.lib.ingest.remote import landing_root, mirror_folder  # noqa: E402

D = date(2024, 1, 1)


@pytest.fixture()
def landing(s3, request) -> str:  # noqa: F811
    """A landing zone of the test's own (moto's store is the process's)."""
    return f"s3://gpu-lake/landing-{request.node.name[:40]}"


def _scrape(host: str) -> bytes:
    lines = expo_lines(f"GPU-{host}", MODELS["A100"], host, "team", D, range(0, 30), 70, 250.0)
    return ("\n".join(lines) + "\n").encode()


def _put(landing: str, key: str, body: bytes) -> None:
    import boto3

    prefix = landing.removeprefix("s3://gpu-lake/")
    boto3.client("s3").put_object(Bucket="gpu-lake", Key=f"{prefix}/{key}", Body=body)


def _delete(landing: str, key: str) -> None:
    import boto3

    prefix = landing.removeprefix("s3://gpu-lake/")
    boto3.client("s3").delete_object(Bucket="gpu-lake", Key=f"{prefix}/{key}")


def _mirrored(landing: str, cache) -> list[str]:
    folder = mirror_folder(landing, cache)
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def _ingest(landing: str, tmp_path) -> tuple[pl.DataFrame, list[str]]:
    """Run the ingest step of D on the S3 landing zone: (its ingest_log, its warnings)."""
    instance = dg.DagsterInstance.ephemeral()
    res = dg.materialize(
        dg.load_assets_from_modules([raw]),
        partition_key=D.isoformat(),
        resources={
            "lake": LakeResource(root=str(tmp_path / "lake"), cache=str(tmp_path / "cache")),
            "landing": LandingResource(root=landing),
        },
        instance=instance,
    )
    assert res.success
    log = pl.read_parquet(tmp_path / "lake" / "ingest_log" / f"date={D}" / "data.parquet")
    warnings = [e.user_message for e in instance.all_logs(res.run_id) if e.level >= 30]
    return log, warnings


LONG = f"n9_{D}_" + "x" * (246 - len(f"n9_{D}_") - len(".prom")) + ".prom"  # 246 bytes
TOO_LONG = f"n8_{D}_" + "y" * 300 + ".prom"


def test_objects_a_folder_cannot_hold_are_skipped_with_why_the_others_mirrored(
    landing, tmp_path, monkeypatch
):
    """Legal objects a local folder cannot hold as they are — a key that is also the folder of
    other keys, a key ending in `/` with content, one deleted after the listing, a name longer
    than a local file's can be — are each skipped with why; a 246-byte name (its temporary
    file's name was longer than 255 bytes) is mirrored; the run ingests the rest and names each
    skipped key."""
    assert len(LONG.encode()) == 246
    _put(landing, "c1/n1_2024-01-01.prom", _scrape("n1"))
    _put(landing, f"c1/{LONG}", _scrape("n9"))
    _put(landing, "odd/c2", _scrape("c2"))  # a file, and the folder of the next key
    _put(landing, "odd/c2/under_2024-01-01.prom", _scrape("u2"))
    _put(landing, "odd/c3/", _scrape("c3"))  # listed as the file `odd/c3`
    _put(landing, "c1/gone_2024-01-01.prom", _scrape("gone"))
    _put(landing, f"c1/{TOO_LONG}", _scrape("n8"))  # no local file can have this name
    sync = remote._sync

    def deleted_after_listing(fs, base, infos, folder):
        _delete(landing, "c1/gone_2024-01-01.prom")
        return sync(fs, base, infos, folder)

    with monkeypatch.context() as m:
        m.setattr(remote, "_sync", deleted_after_listing)
        root, refused = landing_root(landing, tmp_path / "cache")
    assert {k: k.why for k in refused} == {
        "c1/gone_2024-01-01.prom": remote.GONE,
        f"c1/{TOO_LONG}": "cannot be mirrored: File name too long",
        "odd/c2": remote.ALSO_FOLDER,
        "odd/c3/": remote.ENDS_IN_SLASH,
    }
    assert _mirrored(landing, tmp_path / "cache") == [
        "c1/n1_2024-01-01.prom",
        f"c1/{LONG}",
        "odd/c2/under_2024-01-01.prom",
    ]
    assert (root / "c1" / LONG).read_bytes() == _scrape("n9")
    # the run: no traceback, the three files ingested, each skipped object named
    _put(landing, "c1/gone_2024-01-01.prom", _scrape("gone"))  # back, and deleted again mid-run
    with monkeypatch.context() as m:
        m.setattr(remote, "_sync", deleted_after_listing)
        log, warnings = _ingest(landing, tmp_path)
    assert sorted(log["source_file"]) == [
        "c1/n1_2024-01-01.prom",
        f"c1/{LONG}",
        "odd/c2/under_2024-01-01.prom",
    ]
    assert log["rows_accepted"].to_list() == [60, 60, 60]
    for key, why in {
        "c1/gone_2024-01-01.prom": remote.GONE,
        f"c1/{TOO_LONG}": "cannot be mirrored: File name too long",
        "odd/c2": remote.ALSO_FOLDER,
        "odd/c3/": remote.ENDS_IN_SLASH,
    }.items():
        assert any(w.endswith(f"{key!r} not read: {why}") for w in warnings), (key, warnings)


class Killed(BaseException):
    """The process stopped midway (what SIGKILL leaves: no handler runs)."""


def test_an_interrupted_mirror_converges_to_the_store(landing, tmp_path, monkeypatch):
    """A mirror stopped midway (after its first download, inside its second), then an object
    deleted from the store: the next run neither ingests the deleted object nor lists what the
    stopped download left; the mirror holds exactly the store's objects."""
    _put(landing, "c1/n1_2024-01-01.prom", _scrape("n1"))
    _put(landing, "c1/n2_2024-01-01.prom", _scrape("n2"))
    copies = []
    copy = shutil.copyfileobj

    def stopped_in_the_second(src, dst, *args):
        copies.append(1)
        if len(copies) == 2:
            dst.write(src.read(100))  # half a file on disk, then the process is gone
            dst.flush()
            raise Killed
        return copy(src, dst, *args)

    with monkeypatch.context() as m, pytest.raises(Killed):
        m.setattr(shutil, "copyfileobj", stopped_in_the_second)
        landing_root(landing, tmp_path / "cache")
    assert "c1/n1_2024-01-01.prom" in _mirrored(landing, tmp_path / "cache")  # the first came down
    _delete(landing, "c1/n1_2024-01-01.prom")
    log, _ = _ingest(landing, tmp_path)
    assert log["source_file"].to_list() == ["c1/n2_2024-01-01.prom"]
    assert log["rows_accepted"].to_list() == [60]
    assert _mirrored(landing, tmp_path / "cache") == ["c1/n2_2024-01-01.prom"]
    assert not list((tmp_path / "cache" / "_landing").rglob("*.part*"))  # nothing left over
    # a later deletion after a complete mirror: gone too
    _put(landing, "c1/n3_2024-01-01.prom", _scrape("n3"))
    _ingest(landing, tmp_path)
    _delete(landing, "c1/n2_2024-01-01.prom")
    _, refused = landing_root(landing, tmp_path / "cache")
    assert refused == [] and _mirrored(landing, tmp_path / "cache") == ["c1/n3_2024-01-01.prom"]
