"""Fixes of the twenty-seventh session's adversarial reviews that fit no other test file."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import pytest
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


def test_the_command_for_a_day_a_replaced_file_no_longer_reaches_runs(tmp_path):
    """A file replaced by one that no longer reaches a day the lake has: the note's command ran
    into "no records for 2024-03-12 … Pass --allow-empty", and the day kept the earlier
    content, billed. The command now carries --allow-empty, and running it empties the day."""
    import shlex

    from helpers import MODELS, cli, cli_env, expo_lines, write_file

    from gpu_pipeline.lib.io.lake import Lake

    env = {**cli_env(tmp_path), "GPU_PIPELINE_START_DATE": "2024-03-01"}
    env["GPU_PIPELINE_EXECUTOR"] = "in_process"
    raw, lake = tmp_path / "raw", tmp_path / "lake"
    d11, d12 = date(2024, 3, 11), date(2024, 3, 12)
    path = raw / "c1" / "h3_2024-03-11.prom"

    def lines(days):
        out = []
        for d in days:
            out += expo_lines("GPU-h3", MODELS["A100"], "h3", "ns", d, range(0, 120), 60, 200.0)
        return out

    write_file(path, lines([d11, d12]))
    flags = ["--raw", str(raw), "--lake", str(lake)]
    cli("materialize", "--start", str(d11), "--end", str(d12), *flags, env=env)
    assert Lake(lake).read("gpu_samples", d12).height == 120  # a row a GPU and time
    write_file(path, lines([d11]))  # replaced: no longer reaches 03-12
    out = cli("materialize", "--start", str(d11), *flags, env=env).stdout
    (note,) = [ln for ln in out.splitlines() if ln.startswith("  note: 2024-03-12 ")]
    command = note.split("earlier content): ", 1)[1]
    assert command.endswith(f"--start 2024-03-12 {shlex.join(flags)} --allow-empty"), command
    words = shlex.split(command)
    again = cli(*words[words.index("materialize") :], env=env)  # as the user would run it
    assert "2024-03-12..2024-03-12  ok" in again.stdout, again.stdout
    assert Lake(lake).read("gpu_samples", d12).height == 0


def test_a_mig_instance_without_activity_leaves_its_gpu_utilization_unknown(tmp_path):
    """A MIG A100-80GB with two 3g.40gb instances, one busy 0.9, the other reporting memory and
    power but no activity field: the physical GPU's utilization was 3/7 x 90 = 38.6 %, the
    unknown instance counted idle, and the fleet's utilization and phase shares with it
    (adversarial review). It is unknown; the free slice stays idle, the instances as they were."""
    from helpers import assembled_day, ms, write_file

    from gpu_pipeline.lib.reference import load_catalog, load_prices
    from gpu_pipeline.lib.samples import collect_stable
    from gpu_pipeline.lib.staging.gpu_minutes import gpu_minutes

    day = date(2024, 6, 10)
    model = "NVIDIA A100-SXM4-80GB"
    lines = []
    for m in range(3):
        t = ms(day, m)
        for gi, ns in ((1, "a"), (2, "b")):
            lab = (
                f'gpu="0",UUID="GPU-mig80",modelName="{model}",Hostname="h",'
                f'GPU_I_PROFILE="3g.40gb",GPU_I_ID="{gi}",namespace="{ns}",pod="{ns}-0"'
            )
            lines.append(f"DCGM_FI_DEV_POWER_USAGE{{{lab}}} 250 {t}")
            lines.append(f"DCGM_FI_DEV_FB_USED{{{lab}}} 1000 {t}")
            if gi == 1:
                lines.append(f"DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{lab}}} 0.9 {t}")
    write_file(tmp_path / "raw" / "h.prom", lines)
    samples = assembled_day(tmp_path / "raw", tmp_path / "cache", day).gpu_samples
    m = collect_stable(gpu_minutes(samples.lazy(), load_catalog(), load_prices()))
    m = m.sort("gpu_instance_id", nulls_last=False)
    physical, one, two = (m.filter(m["gpu_instance_id"].eq_missing(i)) for i in (None, 1, 2))
    assert physical.height == one.height == two.height == 3
    assert physical["gpu_util_pct"].null_count() == 3
    assert physical["phase"].cast(str).to_list() == ["unknown"] * 3
    assert physical["gpu_share"].to_list() == pytest.approx([1 / 7] * 3)
    assert one["gpu_util_pct"].to_list() == pytest.approx([90.0] * 3)
    assert two["gpu_util_pct"].null_count() == 3


def test_the_report_says_which_gpu_hours_have_no_price(tmp_path):
    """A price book without the H100: namespace beta (0.5 h on an A100, 3 h on the H100) read
    cost $1.25, waste $0.00 in the report's namespaces, and the top figures never said that 3
    of 3.5 GPU-hours had no price (adversarial review; `summary` and the showback did)."""
    import dagster as dg
    from helpers import MODELS, expo_lines, write_file
    from test_report_command26 import text

    from gpu_pipeline.defs import marts, raw, report, staging
    from gpu_pipeline.defs.resources import LakeResource, LandingResource, ReferenceResource
    from gpu_pipeline.lib.reference import DEFAULT_PRICES

    day = date(2024, 1, 31)
    book = tmp_path / "no_h100.csv"
    shipped = DEFAULT_PRICES.read_text().splitlines(keepends=True)
    book.write_text("".join(ln for ln in shipped if not ln.startswith("H100")))
    lines = expo_lines("GPU-a1", MODELS["A100"], "h1", "beta", day, range(30), 95, 380.0)
    lines += expo_lines("GPU-h1", MODELS["H100"], "h2", "beta", day, range(180), 50, 300.0, gpu=1)
    write_file(tmp_path / "raw" / "c1" / "h.prom", lines)
    res = dg.materialize(
        [raw.build_ingest(), *dg.load_assets_from_modules([staging, marts, report])],
        partition_key=str(day),
        resources={
            "lake": LakeResource(root=str(tmp_path / "lake")),
            "landing": LandingResource(root=str(tmp_path / "raw")),
            "reference": ReferenceResource(prices=str(book)),
        },
        instance=dg.DagsterInstance.ephemeral(),
        raise_on_error=False,
    )
    assert res.success
    page = text(tmp_path / "lake" / "_reports" / f"gpu_report_{day}.html")
    assert "GPU-hours without a price 3.0 of 3.5" in page
    assert "(not over 3.0 GPU-h without a price)" in page


def test_the_showback_says_when_its_days_were_priced_with_two_books(tmp_path):
    """02-01 priced with the shipped book ($2.50 an A100-hour), 02-02 with one at $5.00: the
    month billed the sum with no word of two rates (adversarial review)."""
    from helpers import MODELS, cli, cli_env, expo_lines, write_file

    from gpu_pipeline.lib.reference import DEFAULT_PRICES

    env = {**cli_env(tmp_path), "GPU_PIPELINE_START_DATE": "2024-02-01"}
    env["GPU_PIPELINE_EXECUTOR"] = "in_process"
    raw, lake = tmp_path / "raw", tmp_path / "lake"
    d1, d2 = date(2024, 2, 1), date(2024, 2, 2)
    for d in (d1, d2):
        lines = expo_lines("GPU-a", MODELS["A100"], "h", "alpha", d, range(60), 80, 300.0)
        write_file(raw / "c1" / f"h_{d}.prom", lines)
    book = tmp_path / "double.csv"
    book.write_text(
        DEFAULT_PRICES.read_text().replace("A100-SXM4-40GB,2.50,", "A100-SXM4-40GB,5.00,")
    )
    assert "A100-SXM4-40GB,5.00," in book.read_text()
    flags = ["--raw", str(raw), "--lake", str(lake)]
    cli("materialize", "--start", str(d1), *flags, env=env)
    out = cli("showback", "--month", "2024-02", "--lake", str(lake), env=env).stdout
    assert "priced at different rates" not in out
    cli("materialize", "--start", str(d2), *flags, "--prices", str(book), env=env)
    out = cli("showback", "--month", "2024-02", "--lake", str(lake), env=env).stdout
    assert (
        "  note: the days were priced at different rates (the price book changed between their "
        "runs): NVIDIA A100-SXM4-40GB at $2.50 (2024-02-01) and $5.00 (2024-02-02); run the days again "
        "with one book to bill at one rate"
    ) in out.splitlines(), out
