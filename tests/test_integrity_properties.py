"""Issue "Integrity, second pass", done when: random link swaps, random kills and random
concurrent runs against one lake leave every partition a whole version from one input, every
run's summary its own, and no byte from outside the landing zone in any table."""

from __future__ import annotations

import hashlib
import os
import re
import signal
import time
from datetime import date
from pathlib import Path

import polars as pl
from helpers import cli, cli_env, expo_lines, start_materialize, write_file
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from gpu_pipeline.lib.io.lake import Lake

D = date(2024, 1, 1)
# a file outside both landing zones, shaped like a scrape of a GPU no landing file holds: if any
# of its bytes reached a table, this GPU (or its text) would be in it
MARKER = "GPU-5ec12e70-0000-4000-8000-000000000000"
INPUTS = {"a": ("GPU-aaaa", 10), "b": ("GPU-bbbb", 25)}  # GPU, minutes of samples (2 fields each)


SHAS: dict[str, set[str]] = {}


def landing(root: Path, name: str) -> Path:
    raw = root / name
    uuid, minutes = INPUTS[name]
    real = write_file(
        raw / "store" / "node.prom",
        expo_lines(uuid, "NVIDIA A10G", "n1", "team", D, range(minutes), 50, 150),
    )
    (raw / "node_link.prom").symlink_to(real)  # the same file, through a link (duplicates)
    SHAS[name] = {hashlib.sha256(real.read_bytes()).hexdigest()}
    return raw


def swap(raw: Path, outside: Path, to_outside: bool) -> None:
    link = raw / "node_link.prom"
    tmp = raw / ".swap"
    tmp.symlink_to(outside if to_outside else raw / "store" / "node.prom")
    os.replace(tmp, link)  # atomic, as a tool would


ACTIONS = st.lists(
    st.one_of(
        st.tuples(st.just("run"), st.sampled_from("ab")),
        st.tuples(st.just("both"), st.just("")),
        st.tuples(st.just("kill"), st.sampled_from("ab"), st.floats(0.2, 4.0)),
        st.tuples(st.just("swap_during"), st.sampled_from("ab"), st.floats(0.0, 2.0)),
    ),
    min_size=2,
    max_size=3,
)


def whole_from_one_input(lake: Lake) -> str | None:
    """The input every raw and minute-level partition of the day was made from (each alone
    from one input), or None when the day was never written."""
    seen = set()
    for table, col in (
        ("gpu_samples", "gpu_uuid"),
        ("gpu_minutes", "gpu_uuid"),
        ("priced_waste", None),
    ):
        if not lake.exists(table, D):
            continue
        df = lake.read(table, D)  # a partition that reads is whole (one atomic file)
        if col:
            gpus = set(df[col].to_list())
            assert MARKER not in gpus
            assert len(gpus) <= 1, (table, gpus)  # never two inputs mixed in one partition
            seen |= gpus
    if lake.exists("ingest_log", D):  # one landing zone's files (told apart by content)
        shas = set(lake.read("ingest_log", D)["sha256"].to_list()) - {""}
        assert any(shas <= SHAS[n] for n in INPUTS), shas
    q = lake.read("quarantine", D) if lake.exists("quarantine", D) else pl.DataFrame()
    for c in ("raw", "reason"):
        if c in q.columns:
            assert not q[c].str.contains(MARKER.lower(), literal=True).fill_null(False).any()
            assert not q[c].str.contains("root:", literal=True).fill_null(False).any()
    return next(iter(seen), None)


def own_count(out: str) -> int | None:
    row = re.search(rf"^  {D}\s+\d+\s+([\d,]+)", out, re.M)
    return int(row.group(1).replace(",", "")) if row else None


# each action is a `materialize` process or two (~5 s each): a few random sequences a run, not
# shrunk (a failure prints its sequence), beside the two a reviewer would try first
@settings(
    max_examples=3,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@example(actions=[("swap_during", "a", 0.6), ("kill", "b", 1.5)])
@given(actions=ACTIONS)
def test_links_kills_and_concurrent_runs_never_mix_inputs_or_leak(tmp_path_factory, actions):
    root = tmp_path_factory.mktemp("prop")
    env = cli_env(root)
    cli("init-instance", env=env)
    outside = write_file(
        root / "outside" / "secret.prom",
        expo_lines(MARKER, "NVIDIA A10G", "n9", "secret", D, range(30), 99, 300),
    )
    raws = {n: landing(root, n) for n in "ab"}
    lake_root = root / "lake"
    lake = Lake(str(lake_root))

    def expect(out: str, name: str) -> None:
        n = own_count(out)
        # its own input's records (20 or 50 samples read twice, once through the link), or
        # nothing new when its input was swapped under it and refused
        uuid, minutes = INPUTS[name]
        assert n in (2 * minutes, 4 * minutes), (name, n, out)

    for action in actions:
        kind = action[0]
        if kind == "run":
            p = cli(
                "materialize",
                "--start",
                str(D),
                "--raw",
                str(raws[action[1]]),
                "--lake",
                str(lake_root),
                env=env,
            )
            expect(p.stdout, action[1])
            assert whole_from_one_input(lake) == INPUTS[action[1]][0]
        elif kind == "both":
            pa = start_materialize(D, raws["a"], lake_root, env)
            pb = start_materialize(D, raws["b"], lake_root, env)
            for p, n in ((pa, "a"), (pb, "b")):
                out = p.communicate(timeout=300)[0]
                assert p.returncode == 0, out
                expect(out, n)
            assert whole_from_one_input(lake) in {"GPU-aaaa", "GPU-bbbb"}
        elif kind == "kill":
            p = start_materialize(D, raws[action[1]], lake_root, env)
            time.sleep(action[2])
            p.send_signal(signal.SIGKILL)
            p.communicate(timeout=60)
            whole_from_one_input(lake)
        elif kind == "swap_during":
            name = action[1]
            p = start_materialize(D, raws[name], lake_root, env)
            time.sleep(action[2])
            swap(raws[name], outside, to_outside=True)
            out = p.communicate(timeout=300)[0]
            assert p.returncode == 0, out
            swap(raws[name], outside, to_outside=False)
            whole_from_one_input(lake)
    # whatever happened, one more run of an input makes the day that input's, every table of it
    p = cli(
        "materialize", "--start", str(D), "--raw", str(raws["b"]), "--lake", str(lake_root), env=env
    )
    expect(p.stdout, "b")
    assert whole_from_one_input(lake) == "GPU-bbbb"
    ids = {
        lake.lineage(t, D)
        for t in (
            "gpu_samples",
            "quarantine",
            "ingest_log",
            "gpu_minutes",
            "gpu_daily",
            "priced_waste",
            "fleet_daily",
            "recommendations",
        )
    }
    assert len(ids) == 1 and None not in ids
    # and the summary is the lake's: 25 GPU-minutes of one GPU
    s = cli("summary", "--start", str(D), "--lake", str(lake_root), env=env).stdout
    assert re.search(r"GPUs: 1\s+GPU-hours: 0\.4\b", s), s
