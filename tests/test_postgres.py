"""deploy/k8s/dagster.yaml's Postgres storage, on a real PostgreSQL 15 (tests/servers.py): a
`gpu-pipeline materialize` through the CLI is recorded there (run, event log, materializations),
Dagster's NOTIFY on every stored event reaches a listener, and the event log watcher sees the
run's events."""

import select
import threading
import time
from pathlib import Path

import pytest
import yaml
from helpers import cli, cli_env, materialize_args
from servers import Postgres

DEPLOY = Path(__file__).resolve().parents[1] / "deploy" / "k8s" / "dagster.yaml"
DAY = "2024-01-01"


@pytest.fixture(scope="module")
def pg():
    server = Postgres()
    yield server
    server.stop()


def storage_section() -> dict:
    return {"storage": yaml.safe_load(DEPLOY.read_text())["storage"]}


def listen(pg: Postgres, ready: threading.Event, stop: threading.Event, got: list) -> None:
    """LISTEN run_events (the channel Dagster's Postgres event log NOTIFYs on) until `stop`."""
    con = pg.connect()
    with con.cursor() as cur:
        cur.execute("LISTEN run_events")
    ready.set()
    while not stop.is_set():
        if select.select([con], [], [], 0.2)[0]:
            con.poll()
            got += [n.payload for n in con.notifies]
            con.notifies.clear()
    con.close()


def test_a_materialize_is_recorded_in_postgres(pg, tmp_path, monkeypatch):
    import dagster as dg

    env = cli_env(tmp_path) | pg.env
    for k, v in pg.env.items():  # this process opens the same instance afterwards
        monkeypatch.setenv(k, v)
    home = Path(env["DAGSTER_HOME"])
    home.mkdir()
    (home / "dagster.yaml").write_text(yaml.safe_dump(storage_section()))
    raw, lake = tmp_path / "raw", tmp_path / "lake"
    cli("generate", "--start", DAY, "--days", "1", "--gpus", "3", "--clusters", "1",
        "--out", str(raw), env=env)  # fmt: skip
    ready, stop, notified = threading.Event(), threading.Event(), []
    listener = threading.Thread(target=listen, args=(pg, ready, stop, notified))
    listener.start()
    assert ready.wait(30)
    try:
        out = cli(*materialize_args(DAY, raw, lake), env=env).stdout
    finally:
        stop.set()
        listener.join(10)
    assert " ok " in out, out
    # the runs table of the Postgres database holds the run (not a SQLite file in DAGSTER_HOME)
    assert not (home / "history").exists()
    rows = pg.sql(pg.db, "SELECT run_id, status FROM runs WHERE pipeline_name = 'daily_pipeline'")
    assert len(rows) == 1 and rows[0][1] == "SUCCESS", rows
    run_id = rows[0][0]
    stored = pg.sql(pg.db, f"SELECT id FROM event_logs WHERE run_id = '{run_id}' ORDER BY id")
    assert len(stored) > 20
    # one NOTIFY per stored event, "<run_id>_<event id>": psycopg2 sends Dagster's NOTIFY
    assert {f"{run_id}_{i}" for (i,) in stored} <= set(notified)

    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert type(instance.run_storage).__name__ == "PostgresRunStorage"
        run = instance.get_run_by_id(run_id)
        assert run.status == dg.DagsterRunStatus.SUCCESS
        assert run.tags["dagster/partition"] == DAY
        mat = instance.get_latest_materialization_event(dg.AssetKey("gpu_minutes"))
        assert mat.run_id == run_id
        assert mat.asset_materialization.partition == DAY
        keys = {k.to_user_string() for k in instance.get_asset_keys()}
        assert {"gpu_samples", "gpu_minutes", "fleet_daily", "priced_waste"} <= keys
        # the event log watcher (Dagster's UI streams a run's logs through it) sees the run
        seen = []

        def callback(entry, _cursor) -> None:
            seen.append(entry)

        instance.event_log_storage.watch(run_id, None, callback)
        try:
            deadline = time.monotonic() + 20
            while len(seen) < len(stored) and time.monotonic() < deadline:
                time.sleep(0.1)
        finally:
            instance.event_log_storage.end_watch(run_id, callback)
        kinds = [e.dagster_event.event_type_value for e in seen if e.dagster_event]
        assert len(seen) == len(stored), (len(seen), len(stored), kinds[:3], kinds[-3:])
        assert kinds.count("ASSET_MATERIALIZATION") >= 12
        assert kinds[-1] == dg.DagsterEventType.RUN_SUCCESS.value


def test_the_deploy_file_names_the_psycopg2_driver():
    from dagster._core.instance.config import dagster_instance_config_schema
    from dagster_postgres.utils import get_conn_string, pg_url_from_config
    from sqlalchemy.engine import make_url

    db = storage_section()["storage"]["postgres"]["postgres_db"]
    assert db["scheme"] == "postgresql+psycopg2"
    values = {"username": "u", "password": "p", "hostname": "h", "db_name": "d", "port": 5432}
    url = pg_url_from_config({"postgres_db": {**values, "scheme": db["scheme"]}})
    assert make_url(url).get_dialect().driver == "psycopg2"
    # without the scheme SQLAlchemy 2.1 takes psycopg 3, on which Dagster's NOTIFY fails
    assert make_url(get_conn_string(**values)).get_dialect().driver == "psycopg"
    assert "storage" in dagster_instance_config_schema()
