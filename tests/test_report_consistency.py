"""What the report and the summary say agrees with itself and with the other (review of labels):

1. the month-to-date table says "unmeasured", as the namespaces table does, for a MIG tenant
   whose cost no reading could split (it said $0.00 of waste);
2. the summary's count of days a GPU was a persistent bottleneck and the report's bottlenecked
   days of the window are labeled as what they count, in the same words;
3. the namespaces table's diagnosis (of active minutes) and the workloads' (SPEC's, idle
   included) say which they are;
4. long model names side by side on the model chart do not overlap;
5. the spot footnote of a day not projected to a month speaks of the day's cost.

Three days of a small fleet, materialized in process: an A100 busy at low power (a bottlenecked
GPU-day each day: a persistent bottleneck on the third), an idle A10G, and an A100 split into
three MIG instances (namespaces a, b, c: their busy minutes unmeasured). An hour a day: 4 % of
the day observed, so the money is the day's, not a month's.
"""

import re
from datetime import date, timedelta
from html import unescape
from pathlib import Path

import dagster as dg
import polars as pl
import pytest
from helpers import MODELS, expo_lines, mig_instance_lines, write_file

from gpu_pipeline.defs import marts, raw, report, staging
from gpu_pipeline.defs.resources import LakeResource, LandingResource, ReferenceResource
from gpu_pipeline.lib.io.lake import Lake

D = date(2024, 1, 10)
DAYS = [D - timedelta(days=2), D - timedelta(days=1), D]
MINUTES = range(600, 660)  # 60 active minutes: the least a bottlenecked GPU-day needs


@pytest.fixture(scope="module")
def lake(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("consistency")
    assets = dg.load_assets_from_modules([raw, staging, marts, report])
    instance = dg.DagsterInstance.ephemeral()
    resources = {
        "lake": LakeResource(root=str(tmp / "lake")),
        "landing": LandingResource(root=str(tmp / "raw")),
        "reference": ReferenceResource(),
    }
    for day in DAYS:  # in order: a day's persistent_bottlenecks reads the days before
        lines = [
            # utilization 90 %, PIF 0.25: every active minute bottlenecked
            *expo_lines("GPU-busy", MODELS["A100"], "h1", "train", day, MINUTES, 90, 100.0),
            *expo_lines("GPU-idle", MODELS["A10G"], "h2", "idle-ns", day, MINUTES, 2, 30.0, gpu=1),
            *mig_instance_lines(day, MINUTES, MODELS["A100"], gpu="6"),
        ]
        write_file(tmp / "raw" / f"h_{day}.prom", lines)
        res = dg.materialize(assets, partition_key=str(day), resources=resources, instance=instance)
        assert res.success
    return tmp / "lake"


@pytest.fixture(scope="module")
def html(lake) -> str:
    from gpu_pipeline.lib.io.report import build_report

    return build_report(Lake(lake), D).html


def cells(fragment: str) -> list[str]:
    return [
        unescape(re.sub(r"<[^>]+>", "", c)) for c in re.findall(r"<t[dh]>(.*?)</t[dh]>", fragment)
    ]


def table_after(html: str, heading: str) -> tuple[list[str], dict[str, list[str]]]:
    """The first table after `heading`: its headers, and its rows by their first cell."""
    t = html[html.index(heading) :]
    t = t[t.index("<table") : t.index("</table>")]
    rows = re.findall(r"<tr>(.*?)</tr>", t)
    heads = cells(rows[0])
    body = [cells(r) for r in rows[1:]]
    return heads, {r[0]: r for r in body}


def cell(html: str, heading: str, row: str, column: str) -> str:
    heads, rows = table_after(html, heading)
    return rows[row][heads.index(column)]


# --- 1. the month to date says unmeasured, as the namespaces table does ---------------------------


def test_the_month_to_date_says_unmeasured_for_mig_tenants(html):
    day = 2.5 * 2 / 7  # A100-SXM4-40GB: $2.50/h; a 2g.20gb instance is 2/7 of it, an hour a day
    for ns in ("a", "b", "c"):
        assert cell(html, "<h2>Namespaces</h2>", ns, "waste $/day") == f"unmeasured (${day:,.2f})"
        row = table_after(html, "<h2>Month to date</h2>")[1][ns]
        hours = f"{3 * 2 / 7:.1f}"  # its slices' share of an hour, three days
        assert row[:5] == [ns, "3", hours, f"${3 * day:,.2f}", f"unmeasured (${3 * day:,.2f})"]
        assert "$0.00" not in row
    # a namespace with measured waste keeps its dollars: the idle A10G, $1.01/h, an hour a day
    assert cell(html, "<h2>Month to date</h2>", "idle-ns", "waste") == "$3.03"


def test_the_month_to_date_frame_carries_the_unmeasured_dollars(lake):
    from gpu_pipeline.lib.io.report.data import namespaces_month_to_date

    m = namespaces_month_to_date(Lake(lake), D)
    got = dict(m.namespaces.select("namespace", "unmeasured_usd").iter_rows())
    assert got["a"] == pytest.approx(3 * 2.5 * 2 / 7)
    assert got["train"] == pytest.approx(0.0) and got["idle-ns"] == pytest.approx(0.0)


def test_namespace_monthly_keeps_the_spec_columns_and_its_unmeasured_dollars(lake):
    from gpu_pipeline.lib.marts.namespace_monthly import namespace_monthly, namespace_usage
    from gpu_pipeline.lib.schemas import TABLES

    money = ["cost_usd", "idle_waste_usd", "stall_waste_usd", "headroom_waste_usd"]
    spec = ["days_covered", "gpu_hours", *money, "total_waste_usd", "energy_kwh", "avg_rfu_pct"]
    assert set(spec) <= set(TABLES["namespace_monthly"])
    lk = Lake(lake)
    usage = namespace_usage(lk.scan_days("gpu_minutes", DAYS))
    month = namespace_monthly(lk.scan_days("priced_waste", DAYS), usage, D).collect()
    assert set(spec) <= set(month.columns)
    a = month.filter(pl.col("namespace") == "a").row(0, named=True)
    assert a["unmeasured_usd"] == pytest.approx(a["cost_usd"]) and a["total_waste_usd"] == 0


# --- 2. days flagged persistent vs bottlenecked days of the window, each said as what it is -------


def test_the_report_says_bottlenecked_days_of_the_window(html):
    heads, rows = table_after(html, "Persistent bottlenecks")
    assert heads[4:6] == ["bottlenecked days (last 7)", "active minutes bottlenecked (last 7 days)"]
    assert rows["GPU-busy"][4:6] == ["3 of 3", "100 %"]  # 3 bottlenecked of its 3 days with data


def test_the_summary_says_days_persistent_and_the_windows_bottlenecked_days(lake):
    from gpu_pipeline.lib.summary import fleet_summary, format_summary

    out = format_summary(fleet_summary(Lake(lake), DAYS[0], D), DAYS[0], D)
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("GPU-busy"))
    # a persistent bottleneck on D only (3 bottlenecked days); in D's window, as the report says
    assert line.endswith(
        f"persistent on 1 of 3 days; window to {D}: bottlenecked days 3 of 3, "
        "active minutes bottlenecked 100 %"
    ), line
    assert "flagged" not in out


# --- 3. the two diagnoses say which they are -------------------------------------------------------


def test_the_namespace_and_workload_diagnoses_say_what_they_count(html):
    ns_heads, ns_rows = table_after(html, "<h2>Namespaces</h2>")
    wl_heads, wl_rows = table_after(html, "<h2>Top workloads")
    ns_col, wl_col = "main diagnosis of active minutes", "main diagnosis (idle included)"
    assert ns_col in ns_heads and wl_col in wl_heads
    assert "main diagnosis" not in ns_heads + wl_heads
    # the idle A10G: no active minute for the namespace's, idle for the workload's (SPEC's)
    idle = ns_rows["idle-ns"]
    assert idle[ns_heads.index("idle %")] == "100.0" and idle[ns_heads.index(ns_col)] == "n/a"
    assert wl_rows["idle-ns"][wl_heads.index(wl_col)] == "idle"
    assert "The workloads' main diagnosis below is that of most of their GPU-time" in html


# --- 5. the spot footnote speaks of the column's period ---------------------------------------------


def test_the_spot_footnote_of_a_day_not_projected_speaks_of_the_day(html):
    section = html[html.index("<h2>Paying less for the same work</h2>") :]
    section = unescape(section[: section.index("<h2>", 5)])
    assert "spot saves $/day (observed)" in section
    assert "× the day's observed cost (not projected to a month)" in section
    assert "monthly" not in section


def test_the_spot_footnote_of_a_projected_day_speaks_of_the_month(lake):
    from gpu_pipeline.lib.io.report import view
    from gpu_pipeline.lib.io.report.data import MONTHLY

    p = view.price(Lake(lake).read("recommendations", D), MONTHLY)
    assert p["cost"] == "monthly cost"
    assert p["table"].heads[1] == "spot saves $/month"


# --- 4. long model names side by side on the model chart do not overlap ----------------------------

LONG_MODELS = [
    "NVIDIA RTX 6000 Ada Generation",
    "NVIDIA H100 80GB HBM3 PCIe-x",
    "NVIDIA A100-SXM4-80GB-longer",
    "NVIDIA GeForce RTX 4090 Laptop GPU",
]


def tick_extents(monkeypatch, draw) -> list[tuple[str, float, float]]:
    """The x tick labels of the chart `draw()` makes, each with its x-extent in the PNG's
    pixels, measured on the figure as it was saved (when `_png` closes it)."""
    from gpu_pipeline.lib.io.report import charts

    plt = charts.pyplot()
    seen = []
    close = plt.close

    def measured_close(fig):
        renderer = fig.canvas.get_renderer()
        scale = 110 / fig.dpi  # the PNG's dpi
        for t in fig.axes[0].get_xticklabels():
            if t.get_text():
                box = t.get_window_extent(renderer)
                seen.append((t.get_text(), box.x0 * scale, box.x1 * scale))
        close(fig)

    monkeypatch.setattr(plt, "close", measured_close)
    draw()
    return sorted(seen, key=lambda e: e[1])


def _models_frame(names: list[str]) -> pl.DataFrame:
    n = len(names)
    return pl.DataFrame(
        {"gpu_model": names, "gpus": [3] * n, "gpu_util_pct": [50.0] * n, "rfu_pct": [30.0] * n}
    )


@pytest.mark.parametrize("n", [2, 4, 8, 30])
def test_long_model_names_side_by_side_do_not_overlap(monkeypatch, n):
    from gpu_pipeline.lib.io.report import charts

    names = [LONG_MODELS[i % 4] + ("" if i < 4 else f" #{i}") for i in range(n)]
    ext = tick_extents(monkeypatch, lambda: charts.models(_models_frame(names)))
    assert len(ext) == n
    gaps = [b[1] - a[2] for a, b in zip(ext, ext[1:], strict=False)]
    assert min(gaps) > 0, list(zip([e[0] for e in ext], gaps, strict=False))
    if n <= 4:  # room to wrap: every word of every name is shown, each with its GPUs
        for text, _, _ in ext:
            assert text.endswith("\n(3 GPUs)")
        shown = [" ".join(t.split("\n")[:-1]).replace("- ", "-") for t, _, _ in ext]
        assert sorted(shown) == sorted(names[:n])


def test_long_model_names_do_not_overlap_on_the_roi_chart(monkeypatch):
    from gpu_pipeline.lib.io.report import charts

    roi = pl.DataFrame(
        {
            "scope": ["fleet"] + ["model"] * 4,
            "gpu_model": [None, *LONG_MODELS],
            "equivalent_gpus": [4.0, 1.0, 1.0, 1.0, 1.0],
            "avg_rfu_pct": [40.0] * 5,
            "monthly_value_usd": [1000.0] * 5,
            "target_rfu_pct": [60.0] * 5,
        }
    )
    ext = tick_extents(monkeypatch, lambda: charts.roi(roi))
    assert len(ext) == 5
    assert all(a[2] < b[1] for a, b in zip(ext, ext[1:], strict=False)), ext


def test_a_name_is_wrapped_at_words_and_cut_after_three_lines():
    from gpu_pipeline.lib.io.report.charts import wrapped

    assert wrapped("NVIDIA H100 80GB HBM3", 16) == "NVIDIA H100 80GB\nHBM3"
    assert wrapped("W" * 100, 10) == "W" * 10 + "\n" + "W" * 10 + "\n" + "W" * 9 + "…"
