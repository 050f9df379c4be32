"""The lake on an object store: a local S3-compatible server on loopback, started by the test."""

import os
from datetime import date, timedelta
from pathlib import Path

import dagster as dg
import polars as pl
import pytest

moto_server = pytest.importorskip("moto.server")

from helpers import MODELS, expo_lines, moto_s3, write_file  # noqa: E402

from gpu_pipeline.defs import marts, raw, report, staging  # noqa: E402
from gpu_pipeline.defs.resources import LakeResource, LandingResource, ReferenceResource  # noqa: E402
from gpu_pipeline.lib.io.lake import Lake  # noqa: E402

START = date(2024, 1, 1)


@pytest.fixture()
def s3(monkeypatch, tmp_path):
    with moto_s3(monkeypatch, "gpu-lake"):
        yield "s3://gpu-lake/fleet"


def test_lake_round_trip_on_s3(s3, tmp_path):
    lake = Lake(s3, cache=tmp_path / "cache")  # parsed files and uploads stage on local disk
    assert lake.remote and lake.days("gpu_daily") == []
    df = pl.DataFrame({"gpu_uuid": ["GPU-a", "GPU-b"], "minutes": [10, 20]})
    path = lake.write("gpu_daily", START, df)
    assert str(path) == "gpu-lake/fleet/gpu_daily/date=2024-01-01/data.parquet"
    assert lake.exists("gpu_daily", START) and not lake.exists(
        "gpu_daily", START + timedelta(days=1)
    )
    back = lake.read("gpu_daily", START)
    assert back["minutes"].to_list() == [10, 20] and back["date"].to_list() == [START] * 2
    lake.write("gpu_daily", START + timedelta(days=2), df.head(1))
    assert lake.days("gpu_daily") == [
        START,
        START + timedelta(days=2),
    ]  # the _schema folder is no day
    assert lake.scan_days("gpu_daily", [START, START + timedelta(days=2)]).collect().height == 3
    lake.write("gpu_daily", START, df.head(1))  # replaced whole
    assert lake.read("gpu_daily", START).height == 1


def test_pipeline_materializes_into_s3(s3, tmp_path):
    for i in range(3):
        d = START + timedelta(days=i)
        lines = expo_lines("GPU-S", MODELS["A100"], "n1", "starved", d, range(600, 700), 85, 100.0)
        lines += expo_lines(
            "GPU-E", MODELS["A100"], "n1", "good", d, range(600, 700), 95, 320.0, gpu=1
        )
        write_file(tmp_path / "raw" / "c1" / f"n1_{d.isoformat()}.prom", lines)
    resources = {
        "lake": LakeResource(root=s3, cache=str(tmp_path / "cache")),
        "landing": LandingResource(root=str(tmp_path / "raw")),
        "reference": ReferenceResource(),
    }
    assets = dg.load_assets_from_modules([raw, staging, marts, report])
    instance = dg.DagsterInstance.ephemeral()
    for i in range(3):
        res = dg.materialize(
            assets,
            partition_key=(START + timedelta(days=i)).isoformat(),
            resources=resources,
            instance=instance,
        )
        assert res.success
    lake = Lake(s3, cache=tmp_path / "cache")
    assert lake.days("gpu_minutes") == [START + timedelta(days=i) for i in range(3)]
    assert lake.read("gpu_minutes", START).height == 200
    assert lake.read("persistent_bottlenecks", START + timedelta(days=2))["gpu_uuid"].to_list() == [
        "GPU-s"
    ]
    w = lake.read("priced_waste", START)
    assert w["cost_usd"].sum() == pytest.approx(2 * 100 / 60 * 2.5)
    # each day's report beside the lake in the store, the same bytes as the pod's copy
    import boto3

    listed = boto3.client("s3").list_objects_v2(Bucket="gpu-lake", Prefix="fleet/_reports/")
    keys = [o["Key"] for o in listed.get("Contents", []) if not o["Key"].endswith("/")]
    names = sorted(k.rsplit("/", 1)[1] for k in keys)
    assert names == [f"gpu_report_{START + timedelta(days=i)}.html" for i in range(3)]
    body = boto3.client("s3").get_object(Bucket="gpu-lake", Key=f"fleet/_reports/{names[0]}")
    local = next(tmp_path.rglob(names[0]), None) or next(Path("data").rglob(names[0]))
    assert body["Body"].read() == local.read_bytes()


def _put_tree(s3_uri: str, folder) -> None:
    """Upload every file below `folder` under the `s3_uri` prefix (keys: relative paths)."""
    import boto3

    bucket, _, prefix = s3_uri.removeprefix("s3://").partition("/")
    client = boto3.client("s3")
    for f in sorted(folder.rglob("*")):
        if f.is_file():
            key = f"{prefix}/{f.relative_to(folder).as_posix()}"
            client.put_object(Bucket=bucket, Key=key, Body=f.read_bytes())


def _cli_lake(tmp_path, raw: str, lake) -> dict:
    from helpers import cli, cli_env

    env = {**cli_env(tmp_path), **{k: v for k, v in os.environ.items() if k.startswith("AWS_")}}
    out = cli("materialize", "--start", str(START), "--raw", raw, "--lake", str(lake), env=env)
    assert "ok" in out.stdout, out.stdout + out.stderr
    return {
        t: pl.read_parquet(lake / t / f"date={START}" / "data.parquet")
        for t in ("gpu_samples", "ingest_log", "gpu_minutes", "priced_waste")
    }


def test_an_s3_landing_zone_is_read_as_the_same_files_on_disk(s3, tmp_path):
    """GPU_PIPELINE_RAW=s3://…: the objects are the landing files (keys as names), the tables
    those of the same files in a local folder; a new object is read by the next run, a deleted
    one is gone from it; an unreachable store fails the run in one line."""
    import boto3

    raw = tmp_path / "raw"
    for h in ("n1", "n2"):
        lines = expo_lines(f"GPU-{h}", MODELS["A100"], h, "team", START, range(0, 90), 70, 250.0)
        write_file(raw / "c1" / f"{h}_{START}.prom", lines)
    landing = "s3://gpu-lake/landing"
    _put_tree(landing, raw)
    remote = _cli_lake(tmp_path / "a", landing, tmp_path / "lake_s3")
    local = _cli_lake(tmp_path / "b", str(raw), tmp_path / "lake_local")
    for t in remote:
        assert remote[t].height > 0 and remote[t].drop("sha256", strict=False).equals(
            local[t].drop("sha256", strict=False)
        ), t
    assert remote["ingest_log"]["source_file"].to_list() == [
        f"c1/n1_{START}.prom",
        f"c1/n2_{START}.prom",
    ]
    assert remote["ingest_log"]["sha256"].equals(local["ingest_log"]["sha256"])
    # a third host lands, the first is deleted: the next run sees both changes
    write_file(
        raw / "c1" / f"n3_{START}.prom",
        expo_lines("GPU-n3", MODELS["A100"], "n3", "team", START, range(0, 90), 70, 250.0),
    )
    _put_tree(landing, raw)
    boto3.client("s3").delete_object(Bucket="gpu-lake", Key=f"landing/c1/n1_{START}.prom")
    again = _cli_lake(tmp_path / "a", landing, tmp_path / "lake_s3_2")
    assert sorted(again["gpu_samples"]["gpu_uuid"].unique().to_list()) == ["GPU-n2", "GPU-n3"]


def test_an_unreachable_s3_landing_zone_fails_in_one_line(tmp_path, monkeypatch):
    from helpers import cli, cli_env

    env = {
        **cli_env(tmp_path),
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9",  # nothing listens there
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    out = cli(
        "materialize",
        "--start",
        str(START),
        "--raw",
        "s3://gpu-lake/landing",
        "--lake",
        str(tmp_path / "lake"),
        "--allow-empty",
        env=env,
        check=False,
    )
    assert out.returncode != 0
    assert "landing zone s3://gpu-lake/landing cannot be listed" in out.stdout + out.stderr


def test_two_writers_of_one_day_on_s3_take_turns(s3, tmp_path, monkeypatch):
    """An S3 lake's day lock: a second holder waits until the first is done; a lock its holder
    stopped renewing (a killed run) is taken over once it has expired."""
    import threading
    import time

    from gpu_pipeline.lib.io import s3lock

    lake = Lake(s3, cache=tmp_path / "cache")
    spans: dict[str, tuple[float, float]] = {}
    waited: list[str] = []

    a_holds = threading.Event()

    def writer(name: str) -> None:
        with lake.day_locks([START], waiting=lambda d: waited.append(name)):
            if name == "a":
                a_holds.set()
                # held until "b" waits (a loaded machine started "b" after a fixed hold ended)
                for _ in range(300):
                    if waited:
                        break
                    time.sleep(0.1)
            t0 = time.monotonic()
            time.sleep(1.5)
            spans[name] = (t0, time.monotonic())

    threads = {n: threading.Thread(target=writer, args=(n,)) for n in ("a", "b")}
    threads["a"].start()
    assert a_holds.wait(30)  # "b" starts only once "a" holds the day (a loaded CI runner)
    threads["b"].start()
    for t in threads.values():
        t.join(30)
    (a0, a1), (b0, b1) = spans["a"], spans["b"]
    assert a1 <= b0 or b1 <= a0, spans  # one after the other, never at once
    assert waited == ["b"]
    # released: the lock object is gone
    import boto3

    keys = boto3.client("s3").list_objects_v2(Bucket="gpu-lake", Prefix="fleet/_locks/")
    assert [o["Key"] for o in keys.get("Contents", []) if o["Key"].endswith(".lock")] == []
    # a holder that died (no release, no renewal) blocks until its lock expires
    monkeypatch.setattr(s3lock, "TTL_S", 1.0)
    dead = s3lock.S3DayLock("gpu-lake", "fleet", START)
    assert dead.try_acquire()
    # the waiter times the unchanged lock on its own monotonic clock (s3lock: machines' clocks
    # are never compared), so it waits out the whole TTL
    t0 = time.time()
    with lake.day_locks([START]):
        took = time.time() - t0
    assert 0.5 < took < 10, took


def test_runs_of_one_day_on_an_s3_lake_take_turns(s3, tmp_path):
    """Through the CLI: while the day's lock is held, a run of that day on the S3 lake writes
    nothing and waits; released, it completes. Two runs of the day at once (different inputs)
    leave one run's tables, never a mix."""
    import subprocess
    import sys
    import time

    from helpers import cli, cli_env

    env = {**cli_env(tmp_path), **{k: v for k, v in os.environ.items() if k.startswith("AWS_")}}
    env["GPU_PIPELINE_CACHE"] = str(tmp_path / "cli_cache")  # not data/cache of the checkout
    cli("init-instance", env=env)
    for name in ("a", "b"):
        lines = expo_lines(f"GPU-{name}", MODELS["A100"], "n1", "ns", START, range(120), 80, 200.0)
        write_file(tmp_path / f"raw_{name}" / f"{name}_{START}.prom", lines)

    # a prefix of its own: moto's store is the process's, shared by the tests' servers
    uri = f"{s3}-turns"

    def start(name: str) -> subprocess.Popen:
        args = ["materialize", "--start", str(START), "--raw", str(tmp_path / f"raw_{name}")]
        return subprocess.Popen(
            [sys.executable, "-m", "gpu_pipeline.cli", *args, "--lake", uri],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    lake = Lake(uri, cache=tmp_path / "cache")
    assert not lake.exists("gpu_samples", START)
    with lake.day_locks([START]):
        p = start("a")
        time.sleep(10)  # long enough for an unlocked run of this tiny day to finish
        assert p.poll() is None, p.communicate()[0]
        assert not lake.exists("gpu_samples", START)
    out = p.communicate(timeout=300)[0]
    assert p.returncode == 0, out
    assert set(lake.read("gpu_minutes", START)["gpu_uuid"]) == {"GPU-a"}
    procs = [start(n) for n in ("b", "a")]
    outs = [q.communicate(timeout=300)[0] for q in procs]
    # the second to get the day finds the first's file gone from its landing zone and its own
    # new: it keeps the day and fails, naming the file it did not ingest
    codes = [q.returncode for q in procs]
    assert 0 in codes and set(codes) <= {0, 1}, outs
    assert all("not ingested" in o for o, c in zip(outs, codes, strict=True) if c), outs
    uuids = {
        t: frozenset(lake.read(t, START)["gpu_uuid"])
        for t in ("gpu_samples", "gpu_minutes", "gpu_daily", "gpu_health")
    }
    assert len(set(uuids.values())) == 1, uuids  # every table of the day from one run
    (gpu,) = uuids["gpu_samples"]
    assert set(lake.read("ingest_log", START)["source_file"]) == {f"{gpu[-1]}_{START}.prom"}


def test_a_fresh_machine_reads_the_parses_another_left_beside_the_lake(s3, tmp_path):
    """Beside an S3 lake the parse cache has a copy (`<lake>/_ingest_cache/`): a run on a
    machine with an empty cache parses nothing another machine parsed, downloads only the
    parses of its own day (the others' meta.json alone), and writes the tables of a local
    parse; a damaged copy is parsed again and replaced."""
    import boto3
    from helpers import cli, cli_env

    days = [START + timedelta(days=i) for i in range(3)]
    raw = tmp_path / "raw"
    for d in days:
        for h in ("n1", "n2"):
            lines = expo_lines(f"GPU-{h}", MODELS["A100"], h, "team", d, range(0, 90), 70, 250.0)
            write_file(raw / f"{h}_{d}.prom", lines)
    uri = f"{s3}-shared"  # a prefix of its own: moto's store is the process's
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    client = boto3.client("s3")
    env = {**cli_env(tmp_path), **{k: v for k, v in os.environ.items() if k.startswith("AWS_")}}

    def run(machine: str, day: date, end: date | None = None) -> str:
        e = {**env, "GPU_PIPELINE_CACHE": str(tmp_path / machine)}
        args = ["materialize", "--start", str(day), "--end", str(end or day), "--raw", str(raw)]
        return cli(*args, "--lake", uri, env=e).stdout

    def shared(suffix: str) -> list[str]:
        listed = client.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/_ingest_cache/")
        return sorted(o["Key"] for o in listed.get("Contents", []) if o["Key"].endswith(suffix))

    assert "parsing 6 new landing file(s)" in run("a", days[0], days[1])
    assert len(shared("/meta.json")) == 6
    lake = Lake(uri, cache=tmp_path / "reader")
    tables = ("gpu_samples", "ingest_log", "gpu_minutes", "priced_waste")
    from_a = {t: lake.read(t, days[1]) for t in tables}  # of machine a's own parses
    out = run("b", days[1])
    assert "parsing" not in out, out
    b = tmp_path / "b"
    assert len(list(b.glob("*/meta.json"))) == 6  # every parse's meta.json …
    assert len({p.parent for p in b.glob("*/samples*.parquet")}) == 2  # … the day's parses whole
    from_b = {t: lake.read(t, days[1]) for t in tables}
    for t in tables:
        assert from_b[t].height > 0 and from_b[t].equals(from_a[t]), t
    # a damaged copy of one of day 2's parses: the next fresh machine parses that file again
    key = next(
        k
        for k in shared(".parquet")
        if "/samples" in k
        and k.split("/")[-2] in {p.parent.name for p in b.glob("*/samples*.parquet")}
    )
    good = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    client.put_object(Bucket=bucket, Key=key, Body=b"PAR1 not a parquet file PAR1")
    assert "parsing" not in run("c", days[1])
    assert lake.read("gpu_samples", days[1]).equals(from_b["gpu_samples"])
    assert client.get_object(Bucket=bucket, Key=key)["Body"].read() == good  # replaced


def test_an_empty_s3_landing_prefix_is_an_empty_landing_zone(s3, tmp_path):
    """An object store has no empty folders: a landing prefix without objects (a fresh deploy,
    retention emptied it) is an empty landing zone, named by its URI; a bucket that does not
    exist cannot be listed."""
    from helpers import cli, cli_env

    env = {**cli_env(tmp_path), **{k: v for k, v in os.environ.items() if k.startswith("AWS_")}}
    args = ["materialize", "--start", str(START), "--raw", "s3://gpu-lake/nothing-yet"]
    args += ["--lake", str(tmp_path / "lake")]
    out = cli(*args, env=env, check=False)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "the landing zone s3://gpu-lake/nothing-yet holds no files: nothing to materialize" in (
        out.stdout + out.stderr
    )
    ok = cli(*args, "--allow-empty", env=env, check=False)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert Lake(tmp_path / "lake").read("ingest_log", START).height == 0
    gone = cli(*args[:4], "s3://no-such-bucket/landing", *args[5:], "--allow-empty", env=env,
               check=False)  # fmt: skip
    assert gone.returncode != 0
    assert "landing zone s3://no-such-bucket/landing cannot be listed" in gone.stdout + gone.stderr
