"""A Dagster instance on Postgres that cannot be used (the server down, a wrong password): the
command said so in ~190 lines, dagster-postgres's retry warnings and the tracebacks (review).
It is one line naming the host, port, database and user, never the password, and exit 1."""

from pathlib import Path

import yaml
from helpers import cli, cli_env, materialize_args
from servers import Postgres, free_port

DEPLOY = Path(__file__).resolve().parents[1] / "deploy" / "k8s" / "dagster.yaml"
DAY = "2024-01-01"
PASSWORD = "Wr0ng-pa$$word"


def _env(tmp_path, **pg) -> dict:
    """A user's environment with DAGSTER_HOME holding deploy/k8s/dagster.yaml's storage."""
    home = tmp_path / "dh"
    home.mkdir()
    storage = yaml.safe_load(DEPLOY.read_text())["storage"]
    (home / "dagster.yaml").write_text(yaml.safe_dump({"storage": storage}))
    return cli_env(tmp_path) | {f"DAGSTER_PG_{k.upper()}": str(v) for k, v in pg.items()}


def _materialize(tmp_path, env):
    raw = tmp_path / "raw"
    raw.mkdir()
    return cli(*materialize_args(DAY, raw, tmp_path / "lake"), env=env, check=False)


def _where(tmp_path, port) -> str:
    return (
        f"error: the Dagster instance's Postgres database 'dagster' at 127.0.0.1:{port} (user "
        "'dagster') cannot be used: "
    )


def _check_tail(tmp_path) -> str:
    return (
        f" (DAGSTER_HOME={tmp_path / 'dh'}; check DAGSTER_PG_HOST, DAGSTER_PG_PORT, DAGSTER_PG_DB,"
        " DAGSTER_PG_USERNAME and DAGSTER_PG_PASSWORD)\n"
    )


def test_an_unreachable_postgres_is_one_line(tmp_path):
    port = free_port()  # nothing listens there
    env = _env(tmp_path, username="dagster", password=PASSWORD, host="127.0.0.1", db="dagster",
               port=port)  # fmt: skip
    p = _materialize(tmp_path, env)
    assert (p.returncode, p.stderr) == (1, "")
    assert p.stdout == (
        _where(tmp_path, port)
        + f'connection to server at "127.0.0.1", port {port} failed: Connection refused'
        + _check_tail(tmp_path)
    )


def test_a_wrong_postgres_password_is_one_line_without_it(tmp_path):
    pg = Postgres()
    try:
        env = _env(tmp_path, username="dagster", password=PASSWORD, host="127.0.0.1",
                   db="dagster", port=pg.port)  # fmt: skip
        p = _materialize(tmp_path, env)
    finally:
        pg.stop()
    assert (p.returncode, p.stderr) == (1, "")
    assert p.stdout == (
        _where(tmp_path, pg.port)
        + f'connection to server at "127.0.0.1", port {pg.port} failed: FATAL: password '
        'authentication failed for user "dagster"' + _check_tail(tmp_path)
    )
    assert PASSWORD not in p.stdout + p.stderr
