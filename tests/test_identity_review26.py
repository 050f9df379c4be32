"""Identity findings of the twenty-sixth review: loop logs whose rows are printed slowly (F1), a
uuid column without values (F5), a record that lost only its UUID (F3), a GPU that drops out
of a loop log before its last iteration (F6)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import polars as pl
import pytest

from gpu_pipeline.lib.ingest.formats import exposition, nvidia_smi
from gpu_pipeline.lib.ingest.formats.common import Context, fill_identity

HDR = "timestamp, power.draw [W], utilization.gpu [%], memory.used [MiB]\n"
DAY = datetime(2026, 3, 23, tzinfo=UTC)


def _ts(t: datetime) -> str:
    return t.strftime("%Y/%m/%d %H:%M:%S.") + f"{t.microsecond // 1000:03d}"


def _uuid(host: str, i: int) -> str:
    x = f"{random.Random(f'{host}-{i}').getrandbits(128):032x}"
    return f"GPU-{x[:8]}-{x[8:12]}-{x[12:16]}-{x[16:20]}-{x[20:]}"


def _loop_log(gpus, hours: float, sleep_ms: int, intra: tuple[int, int], header_each: bool):
    """A loop log without identity columns; GPU i's memory.used is 10000*(i+1) MiB. `gpus`:
    the GPUs an iteration starting at t lists (a function of t) or their number."""
    rnd = random.Random(7)
    out, t = ([] if header_each else [HDR]), DAY
    while t < DAY + timedelta(hours=hours):
        if header_each:
            out.append(HDR)
        tt = t + timedelta(milliseconds=300 if header_each else 0)  # nvidia-smi's start-up
        for i in gpus(t) if callable(gpus) else range(gpus):
            tt += timedelta(milliseconds=rnd.randint(*intra))
            out.append(f"{_ts(tt)}, {100 + i * 50:.2f} W, {10 * i} %, {10000 * (i + 1)} MiB\n")
        t = tt + timedelta(milliseconds=sleep_ms)
    return "".join(out)


def _parse_csv(text: str, name: str = "c1/h1/loop.csv"):
    return nvidia_smi.parse(text, Context(name))


def _fb_by_gpu(out) -> dict[str, set[float]]:
    fb = out.samples.filter(pl.col("column") == "fb_used_mib")
    return {u: set(v) for u, v in fb.group_by("gpu_uuid").agg(pl.col("value").unique()).iter_rows()}


# F1 ---------------------------------------------------------------------------------------


def test_slow_rows_with_a_header_above_every_iteration_are_eight_gpus():
    """`while true; do nvidia-smi --query-gpu=... --format=csv; sleep 5; done` on 8 GPUs whose
    rows are printed 60-120 ms apart: eight GPUs, each its own rows, none merged."""
    text = _loop_log(8, 4, 5000, (60, 120), header_each=True)
    assert len(text) > 2**20
    out = _parse_csv(text)
    by_gpu = _fb_by_gpu(out)
    assert len(by_gpu) == 8
    assert sorted(min(v) for v in by_gpu.values()) == [10000.0 * (i + 1) for i in range(8)]
    assert all(len(v) == 1 for v in by_gpu.values())
    assert out.quarantine.height == 0


def test_slow_rows_of_a_dash_l_loop_are_four_gpus():
    """`nvidia-smi --query-gpu=... -l 1` on 4 GPUs whose rows are 30-80 ms apart (one header):
    told by the gaps, far apart from the loop's second."""
    text = _loop_log(4, 2, 1000, (30, 80), header_each=False)
    assert len(text) > 2**20
    out = _parse_csv(text)
    by_gpu = _fb_by_gpu(out)
    assert len(by_gpu) == 4 and all(len(v) == 1 for v in by_gpu.values())
    assert out.quarantine.height == 0


@pytest.mark.parametrize("header_each", [False, True])
def test_one_gpu_with_stalls_stays_one_gpu(header_each):
    """A log whose iterations hold one row is one GPU, the loop's stalls (seconds) and slow
    calls notwithstanding."""
    rnd = random.Random(3)
    out, t = ([] if header_each else [HDR]), DAY
    while t < DAY + timedelta(hours=6):
        if header_each:
            out.append(HDR)
        out.append(f"{_ts(t)}, 250.00 W, 80 %, 10000 MiB\n")
        t += timedelta(milliseconds=1000 + rnd.randint(0, 60))
        if rnd.random() < 0.05:
            t += timedelta(seconds=rnd.randint(2, 30))  # a stall
    parsed = _parse_csv("".join(out))
    assert parsed.samples["gpu_uuid"].n_unique() == 1
    assert parsed.quarantine.height == 0


# F5 ---------------------------------------------------------------------------------------


def test_a_uuid_column_without_values_is_absent():
    """A uuid column that reads [N/A] on every row (WSL, passthrough): the GPUs are told as
    without it (the loop), nothing quarantined for want of an identity."""
    out, t = ["timestamp, uuid, name, utilization.gpu [%], power.draw [W]\n"], DAY
    while t < DAY + timedelta(hours=8):
        for i in range(2):
            out.append(
                f"{_ts(t + timedelta(milliseconds=2 + i * 3))}, [N/A], NVIDIA GeForce RTX 4090, "
                f"{30 + i * 40} %, {100 + i * 200:.2f} W\n"
            )
        t += timedelta(seconds=3)
    text = "".join(out)
    assert len(text) > 2**20
    parsed = _parse_csv(text)
    assert parsed.quarantine.height == 0
    power = parsed.samples.filter(pl.col("column") == "power_w")
    by_gpu = power.group_by("gpu_uuid").agg(pl.col("value").unique())
    assert sorted(v.to_list() for v in by_gpu["value"]) == [[100.0], [300.0]]
    assert "uuid" not in parsed.columns_ignored


# F3 ---------------------------------------------------------------------------------------


def test_csv_rows_whose_uuid_reads_na_keep_their_gpu():
    """index, uuid, pci.bus_id logged; GPU 2's uuid reads [N/A] for an hour: its rows are still
    GPU 2 (its bus id has one UUID in the file), four GPUs, not five."""
    out, t = (
        ["timestamp, index, uuid, pci.bus_id, name, utilization.gpu [%], power.draw [W]\n"],
        DAY,
    )
    while t < DAY + timedelta(hours=4):
        for i in range(4):
            u = "[N/A]" if (i == 2 and t.hour == 1) else _uuid("z1", i)
            out.append(
                f"{_ts(t + timedelta(milliseconds=i + 1))}, {i}, {u}, 00000000:{0x18 + i:02X}:00.0, "
                f"NVIDIA A100-SXM4-40GB, {50 + i} %, {200 + i:.2f} W\n"
            )
        t += timedelta(seconds=2)
    text = "".join(out)
    assert len(text) > 2**20
    parsed = _parse_csv(text)
    gpus = set(parsed.samples["gpu_uuid"].unique())
    assert gpus == {_uuid("z1", i) for i in range(4)}
    assert parsed.quarantine.height == 0


def _ctx(name: str) -> Context:
    return Context(name, file_time=DAY)


def _scrape(host: str, lost: set[int], uuids=None) -> str:
    lines = []
    for i in range(8):
        u = "" if i in lost else f'UUID="{(uuids or {}).get(i, _uuid(host, i))}",'
        for f, v in (("DCGM_FI_DEV_GPU_UTIL", 50 + i), ("DCGM_FI_DEV_POWER_USAGE", 300 + i)):
            lines.append(
                f'{f}{{gpu="{i}",{u}pci_bus_id="00000000:{0x18 + i:02X}:00.0",device="nvidia{i}",'
                f'modelName="NVIDIA H100 80GB HBM3",Hostname="{host}"}} {v}\n'
            )
    return "".join(lines)


def test_a_scrape_line_without_its_uuid_is_the_gpu_its_bus_id_names():
    """dcgm-exporter scrapes of an 8-GPU host where a few lines lost UUID=: eight GPUs, the
    lines taking the UUID their bus id has on the same host in the file."""
    text = _scrape("k1", {3}) + _scrape("k1", set())
    parsed = exposition.parse(text, _ctx("c1/k1/metrics_2026-03-11T00:00:00Z.prom"))
    assert set(parsed.samples["gpu_uuid"]) == {_uuid("k1", i) for i in range(8)}
    # the second scrape, without timestamps, is written again at an unknown time (p20): its
    # lines are quarantined, the first scrape's (GPU 3's without UUID=) are all read
    q = parsed.quarantine
    assert q.height == 16 and q["line"].min() == 17
    assert set(q["reason"]) == {exposition.REPEATED_UNTIMED}


def test_a_bus_id_with_two_uuids_merges_nothing():
    """The same bus id under two UUIDs on the host (a GPU swapped): a line without a UUID is
    neither, as before (its identity made of the bus id)."""
    other = {5: _uuid("swap", 5)}
    text = _scrape("k1", {5}) + _scrape("k1", set()) + _scrape("k1", set(), other)
    parsed = exposition.parse(text, _ctx("c1/k1/m.prom"))
    gpus = set(parsed.samples["gpu_uuid"])
    assert len(gpus) == 10 and any(g.startswith("GPU-pci-") for g in gpus)


def test_lookup_on_distinct_series_keeps_scopes_apart():
    """fill_identity on a file's distinct series (as `normalize_series` runs it): a series
    without a UUID takes the one of its host's bus id, never another host's."""
    u = _uuid("a", 0)
    df = pl.DataFrame(
        {
            "gpu_uuid": [u, None, None, None],
            "pci_bus_id": ["00000000:18:00.0"] * 4,
            "gpu_index": [0, 0, 0, None],
            "hostname": ["a", "a", "b", None],
        },
        schema_overrides={"gpu_index": pl.Int32},
    )
    got = fill_identity(df, "f.prom")["gpu_uuid"].to_list()
    assert got[:2] == [u, u]
    assert got[2].startswith("GPU-pci-") and got[3].startswith("GPU-pci-") and got[2] != got[3]


def test_the_series_table_of_many_files_leaves_looked_up_series_to_their_file():
    """`learn_series` parses many files' series in one frame: a series without a UUID is
    looked up in its own file's parse only (the table gives what the file's own parse does)."""
    a = _scrape("k1", {3}) + _scrape("k1", set())
    b = _scrape("k1", set(), {3: _uuid("swap", 3)})
    names = {"c1/k1/a.prom": a, "c1/k1/b.prom": b}
    plain = {n: exposition.parse(t, _ctx(n)) for n, t in names.items()}
    try:
        exposition.learn_series([t.encode() for t in names.values()])
        for n, t in names.items():
            got = exposition.parse(t, _ctx(n))
            assert got.samples.equals(plain[n].samples), n
    finally:
        exposition.forget_series()
    assert set(plain["c1/k1/a.prom"].samples["gpu_uuid"]) == {_uuid("k1", i) for i in range(8)}


# F6 ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("header_each", [False, True])
def test_a_gpu_that_drops_out_is_not_replaced_in_the_last_iteration(header_each):
    """A 4-GPU loop whose GPU 2 drops out at 02:00: the 3-row iterations after it, the last
    one too, are quarantined; no row of GPU 3 is filed as GPU 2."""
    text = _loop_log(
        lambda t: [0, 1, 2, 3] if t.hour < 2 else [0, 1, 3], 3, 2000, (2, 20), header_each
    )
    parsed = _parse_csv(text)
    by_gpu = _fb_by_gpu(parsed)
    assert len(by_gpu) == 4 and all(len(v) == 1 for v in by_gpu.values())
    last = text.rstrip("\n").rsplit("\n", 1)[1]
    assert last in set(parsed.quarantine["raw"])


# F4 ---------------------------------------------------------------------------------------


def _uuid_log(end: str) -> str:
    """An 8-GPU `-l 1` log with uuid as its last column, over 1 MiB, and `end` after it."""
    rows = ["timestamp, name, utilization.gpu [%], power.draw [W], uuid"]
    for s in range(2000):
        for g in range(8):
            t = DAY + timedelta(seconds=s, milliseconds=g)
            rows.append(f"{_ts(t)}, NVIDIA H100 80GB HBM3, {10 * g}, {100 + g}.5, {_uuid('h', g)}")
    return "\n".join(rows) + "\n" + end


def test_a_last_line_cut_inside_its_uuid_is_quarantined_not_a_gpu():
    """A log read while it is being written: its last line ends inside the uuid (no line end).
    That uuid made a ninth GPU of one sample; it is one quarantined record."""
    whole = _uuid_log("")
    assert len(whole) > 2**20
    last = whole.split("\n")[4]  # GPU 3's first row
    cut = last[: last.index(_uuid("h", 3)) + 12]
    out = _parse_csv(_uuid_log(cut))
    assert out.samples["gpu_uuid"].n_unique() == 8
    (q,) = out.quarantine.to_dicts()
    assert q["line"] == 2000 * 8 + 2 and "cut short while the log was being written" in q["reason"]
    assert out.lines_total == 2000 * 8 + 2
    # a last line that is whole, or ends in a uuid of its own, is read as before
    for end in (last, last.replace(_uuid("h", 3), "GPU-9f000000-0000-0000-0000-000000000000")):
        out = _parse_csv(_uuid_log(end))
        assert out.quarantine.height == 0 and out.samples.height == (2000 * 8 + 1) * 2


# F7 ---------------------------------------------------------------------------------------


def test_two_machines_that_log_localhost_are_not_merged():
    """Two machines' logs with a hostname column reading `localhost` and an index: their GPUs
    are scoped by file, not merged into one machine's."""
    rows = ["timestamp, hostname, index, utilization.gpu [%], power.draw [W]"]
    for s in range(600):
        for g in range(2):
            t = DAY + timedelta(seconds=s, milliseconds=g)
            rows.append(f"{_ts(t)}, localhost, {g}, {10 * g}, {100 + g}.5")
    text = "\n".join(rows) + "\n"
    a, b = _parse_csv(text, "c1/m1/gpu.csv"), _parse_csv(text, "c1/m2/gpu.csv")
    ua, ub = set(a.samples["gpu_uuid"]), set(b.samples["gpu_uuid"])
    assert len(ua) == len(ub) == 2 and not ua & ub
    named = _parse_csv(text.replace("localhost", "node-7"), "c1/m1/gpu.csv")
    assert set(named.samples["gpu_uuid"]) == set(
        _parse_csv(text.replace("localhost", "node-7"), "c1/m2/gpu.csv").samples["gpu_uuid"]
    )
