"""`gpu-pipeline pull` of a day a real VictoriaMetrics holds nothing for lands nothing and leaves
nothing behind: no empty `<cluster>/_pulled/<server>/` folder (nor a landing root it had to
make), while the folders that were there before stay as they were."""

import os
from datetime import date
from pathlib import Path

import pytest
from helpers import cli, cli_env
from servers import load, start_victoria_metrics

from gpu_pipeline.lib.generate import generate

DAY = date(2026, 5, 1)  # on the server
EMPTY = date(2026, 5, 2)  # not
CLUSTER = "us-east-train"


@pytest.fixture(scope="module")
def vm(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("vm_empty")
    proc, url = start_victoria_metrics(tmp)
    try:
        load(url, generate(tmp / "files", DAY, days=1, gpus=1, clusters=1, seed=3))
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def tree(root: Path) -> list[str]:
    """Every folder and file under `root`, relative, sorted."""
    out = []
    for d, dirs, files in os.walk(root):
        rel = Path(d).relative_to(root)
        out += [str(rel / n) + "/" for n in dirs] + [str(rel / n) for n in files]
    return sorted(out)


def pull(url: str, raw: Path, env: dict, *days: date):
    span = ["--start", str(days[0]), "--end", str(days[-1])]
    return cli("pull", *span, "--url", url, "--raw", str(raw), env=env, check=False)


def test_a_pull_of_a_day_without_data_leaves_nothing_behind(vm, tmp_path):
    env = {**cli_env(tmp_path), "GPU_PIPELINE_PROM_CLUSTER": CLUSTER}
    # a landing zone that does not exist yet: the pull made it, and removes it again
    fresh = tmp_path / "fresh"
    p = pull(vm, fresh, env, EMPTY)
    assert p.returncode == 1, p.stdout + p.stderr
    assert f"error: {vm} holds no DCGM samples for {EMPTY}..{EMPTY}" in p.stdout
    assert not fresh.exists(), tree(fresh)

    # a landing zone with another cluster's file: it stays exactly as it was
    raw = tmp_path / "raw"
    (raw / "other").mkdir(parents=True)
    (raw / "other" / "h1_2026-05-02.prom").write_text("# nothing\n")
    before = tree(raw)
    p = pull(vm, raw, env, EMPTY)
    assert p.returncode == 1, p.stdout + p.stderr
    assert tree(raw) == before == ["other/", "other/h1_2026-05-02.prom"]


def test_a_range_lands_the_day_with_data_and_nothing_for_the_one_without(vm, tmp_path):
    env = {**cli_env(tmp_path), "GPU_PIPELINE_PROM_CLUSTER": CLUSTER}
    raw = tmp_path / "raw"
    p = pull(vm, raw, env, DAY, EMPTY)
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"{EMPTY}: 0 file(s) (0 changed), 0 samples" in p.stdout
    server = next((raw / CLUSTER / "_pulled").iterdir())
    assert [d.name for d in server.iterdir()] == [str(DAY)]  # no folder, hidden or not, else
    assert len(list((server / str(DAY)).iterdir())) > 0

    # the server's folder holds an earlier day: pulling an empty day again leaves it as it was
    before = tree(raw)
    assert pull(vm, raw, env, EMPTY).returncode == 1
    assert tree(raw) == before
