"""Fixes of the twenty-seventh session's adversarial reviews that fit no other test file."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from helpers import landed

from gpu_pipeline.lib.ingest.landing import list_landing, parse_landing_file

MTIME = datetime(2024, 3, 15, 12, tzinfo=UTC).timestamp()


def test_an_implausible_time_is_worded_without_the_minute_it_was_read(tmp_path):
    """The reason named the latest plausible minute (a day after the parse), so the same file
    parsed again gave another quarantine: "re-materializing a partition gives the same
    contents" did not hold."""
    future = int((datetime.now(UTC) + timedelta(days=30)).timestamp() * 1000)
    lines = [
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="GPU-a",Hostname="h"}} 50 {t}'
        for t in (1710504000000, 946684799000, future)
    ]
    landed(tmp_path, "c/h.prom", ("\n".join(lines) + "\n").encode(), MTIME)
    (lf,) = list_landing(tmp_path / "raw")
    _, parsed = parse_landing_file(lf)
    reasons = parsed.quarantine.sort("line").get_column("reason").to_list()
    assert parsed.samples.height == 1
    assert reasons == [
        "implausible sample time 946684799000 ms since 1970: before 2000-01-01 00:00 (a clock "
        "reset, or timestamps in another unit than the format's)",
        f"implausible sample time {future} ms since 1970: more than a day after the file was "
        "read (a clock reset, or timestamps in another unit than the format's)",
    ]
