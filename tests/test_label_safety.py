"""What users read stays honest whatever the telemetry's labels hold (adversarial review of the
report and the summary, items 1-5).

Labels (namespace, pod, workload, hostname, model, cluster) come from telemetry and can be any
text up to 1 KiB: bidi controls, carriage returns, ANSI and OSC-8 escapes, 1,000 characters. One
day of such a fleet, materialized in process, with a MIG GPU (tenants whose cost is all
unmeasured) and a GPU of a model not in the catalog (utilization, no RFU).
"""

import json
import re
import shutil
import subprocess
import unicodedata
from datetime import date
from html.parser import HTMLParser
from pathlib import Path

import dagster as dg
import polars as pl
import pytest
from helpers import MODELS, expo_lines, mig_instance_lines, write_file

from gpu_pipeline.defs import marts, raw, report, staging
from gpu_pipeline.defs.resources import LakeResource, LandingResource, ReferenceResource
from gpu_pipeline.lib.io.lake import Lake

D = date(2024, 1, 10)
BIDI = "team-a\u202e"  # RIGHT-TO-LEFT OVERRIDE, never closed
CTRL = "x\ry\x1b[31mz"  # a carriage return and a colour
OSC = "o\x1b]8;;http://evil.example\x07k\x1b]8;;\x07"  # an OSC-8 hyperlink
LONG = "L" * 1000
MINUTES = range(600, 660)
BIDI_CONTROLS = set("\u061c\u200e\u200f\u2028\u2029") | set(map(chr, range(0x202A, 0x202F)))
BIDI_CONTROLS |= set(map(chr, range(0x2066, 0x206A)))


@pytest.fixture(scope="module")
def lake(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("labels")
    lines = [
        # idle H100 of the bidi namespace: the most dollars, so first in "What to do first"
        *expo_lines("GPU-bidi", MODELS["H100"], "h1", BIDI, D, MINUTES, 2, 80.0, gpu=0),
        *expo_lines("GPU-ctrl", MODELS["A100"], "h2", CTRL, D, MINUTES, 3, 60.0, gpu=1),
        *expo_lines("GPU-osc", MODELS["A100"], "h3", OSC, D, MINUTES, 3, 60.0, gpu=2),
        *expo_lines("GPU-long", MODELS["A10G"], LONG[:900], LONG, D, MINUTES, 5, 40.0, gpu=3),
        # a model not in the catalog, without a power limit: utilization, no RFU
        *expo_lines("GPU-unk", "Mystery GPU 9000", "h4", "unk", D, MINUTES, 90, 300.0, gpu=4),
        # an A100 split into three instances (namespaces a, b, c): no power reading of their
        # own, so their busy minutes are unmeasured
        *mig_instance_lines(D, MINUTES, MODELS["A100"], gpu="6"),
    ]
    write_file(tmp / "raw" / "h_2024-01-10.prom", lines)
    res = dg.materialize(
        dg.load_assets_from_modules([raw, staging, marts, report]),
        partition_key=D.isoformat(),
        resources={
            "lake": LakeResource(root=str(tmp / "lake")),
            "landing": LandingResource(root=str(tmp / "raw")),
            "reference": ReferenceResource(),
        },
        instance=dg.DagsterInstance.ephemeral(),
    )
    assert res.success
    assert Lake(tmp / "lake").read("quarantine", D).height == 0  # every label reached the marts
    return tmp / "lake"


def html_of(lake: Path) -> str:
    from gpu_pipeline.lib.io.report import build_report

    return build_report(Lake(lake), D).html


def summary_of(lake: Path) -> str:
    from gpu_pipeline.lib.summary import fleet_summary, format_summary

    return format_summary(fleet_summary(Lake(lake), D, D), D, D)


class Runs(HTMLParser):
    """The page's text runs, each with the elements it is inside."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.runs: list[tuple[str, tuple[str, ...]]] = []

    def handle_starttag(self, tag, attrs):
        self.stack.append(tag)

    def handle_endtag(self, tag):
        while self.stack and self.stack.pop() != tag:
            pass

    def handle_data(self, data):
        self.runs.append((data, tuple(self.stack)))


# --- 1. bidi controls never reorder the report's text ---------------------------------------------


def test_a_label_never_reorders_the_text_around_it(lake):
    html = html_of(lake)
    p = Runs()
    p.feed(html)
    with_bidi = [(t, s) for t, s in p.runs if BIDI_CONTROLS & set(t)]
    assert with_bidi, "the bidi namespace is in the report"
    # every run holding a bidi control is a label isolated in <bdi>, in sentences and cells
    assert all("bdi" in s for _, s in with_bidi), [(t, s) for t, s in with_bidi if "bdi" not in s]
    places = {s[-2] if s[-1] == "bdi" else s[-1] for _, s in with_bidi}
    assert {"b", "td"} <= places, places  # "What to do first" and the tables
    first = html[html.index("<ol class='first'>") :]
    assert f"for <b><bdi>{BIDI}</bdi></b>: about <b>$" in first.split("</li>", 1)[0]


# --- 2. the terminal gets no control character from a label ---------------------------------------


def test_the_summary_prints_control_characters_as_escapes(lake):
    out = summary_of(lake)
    bad = {c for c in out if c != "\n" and (unicodedata.category(c) == "Cc" or c in BIDI_CONTROLS)}
    assert not bad, bad
    assert "x\\ry\\x1b[31mz" in out and "o\\x1b]8;;http://evil.example\\x07k" in out
    assert "team-a\\u202e" in out
    # alignment: the escaped label is padded as it prints, the model column stays put
    rows = [ln for ln in out.splitlines() if " waste " in ln and "NVIDIA A100-SXM4-40GB" in ln]
    ctrl = next(ln for ln in rows if ln.startswith("    x\\r"))
    other = next(ln for ln in rows if ln.startswith("    (no namespace) "))
    assert ctrl.index("NVIDIA") == other.index("NVIDIA") == 4 + 16 + 1


# --- 3. a long label never breaks a table ---------------------------------------------------------


def test_a_long_label_is_cut_in_table_cells_with_the_whole_in_a_tooltip(lake):
    from gpu_pipeline.lib.io.report.view import CELL_CHARS

    html = html_of(lake)
    cells = re.findall(r"<td><bdi(?: title='([^']*)')?>(.*?)</bdi></td>", html, re.S)
    assert cells
    assert max(len(text) for _, text in cells) <= CELL_CHARS
    cut = [(full, text) for full, text in cells if full]
    assert cut and all(full.startswith(LONG[:900]) for full, _ in cut)  # namespace, host, pod
    assert all(t.endswith("…") and full.startswith(t[:-1]) for full, t in cut)
    assert "L" * (CELL_CHARS + 1) not in re.sub(r"title='[^']*'", "", html)


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    pytest.fail("chromium is not installed: `make test` installs it (apt-get install -y chromium)")


PROBE = """<script>window.addEventListener('load', () => {
  const out = [...document.querySelectorAll('table')].map(t => ({
    width: Math.ceil(t.getBoundingClientRect().width), box: t.parentElement.clientWidth,
    head: t.querySelector('th') ? t.querySelector('th').textContent : ''}));
  const pre = document.createElement('pre'); pre.id = 'probe';
  pre.textContent = JSON.stringify(out); document.body.appendChild(pre);
});</script>"""


def test_no_table_is_wider_than_the_page_in_a_real_browser(lake, tmp_path):
    page = tmp_path / "probe.html"
    page.write_text(html_of(lake).replace("<head>", "<head>" + PROBE, 1))
    out = subprocess.run(
        [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
        + ["--window-size=1280,900", "--virtual-time-budget=15000", "--dump-dom", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    )
    found = re.search(r'<pre id="probe">(.*?)</pre>', out.stdout, re.S)
    assert found, out.stderr[-2000:]
    tables = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    assert len(tables) >= 5
    # each table fits the page's column: nothing scrolls sideways, no money column off-screen
    wide = [t for t in tables if t["width"] > t["box"]]
    assert not wide, wide


# --- 4. the headline's three numbers say which minutes they are over ------------------------------


def _gap_minutes(lake: Path) -> tuple[int, int, float, float]:
    """By hand: physical GPU-minutes, those with utilization and RFU, and their means there."""
    m = Lake(lake).read("gpu_minutes", D).filter(pl.col("gpu_instance_id").is_null())
    both = m.filter(pl.col("gpu_util_pct").is_not_null() & pl.col("rfu_pct").is_not_null())
    return m.height, both.height, both["gpu_util_pct"].mean(), both["rfu_pct"].mean()


def test_the_summary_headline_says_which_minutes_each_figure_is_over(lake):
    observed, both, util, rfu = _gap_minutes(lake)
    assert both < observed  # the unknown model's minutes have utilization and no RFU
    out = summary_of(lake)
    head = out[out.index("avg utilization") :]
    assert head.splitlines()[0].endswith("(over different GPU-minutes:)")
    assert f"utilization is over {observed:,} of {observed:,} GPU-minutes, RFU over {both:,}" in out
    assert f"over those {both:,}, utilization {util:.1f} % vs RFU {rfu:.1f} %" in out
    # the gap printed is the difference of those two (one day: fleet_daily's own)
    gap = float(re.search(r"gap (-?[\d.]+) points", out)[1])
    assert gap == pytest.approx(util - rfu, abs=0.051)


def test_the_report_headline_says_which_minutes_each_figure_is_over(lake):
    observed, both, util, rfu = _gap_minutes(lake)
    html = html_of(lake)
    kpi = dict(re.findall(r"<div class='kpi'>([^<]+)<b>([^<]+)</b></div>", html))
    assert kpi["utilization where RFU known"] == f"{util:.1f} %"
    note = html[html.index("<p class='caveat'>Utilization, RFU and the gap") :]
    note = note[: note.index("</p>")]
    assert f"utilization is over the {observed:,} of {observed:,}" in note
    assert f"the gap over the {both:,} with both" in note
    assert f"utilization is {util:.1f} % and RFU {rfu:.1f} %" in note


def test_a_fleet_whose_minutes_all_have_rfu_prints_the_headline_alone():
    from gpu_pipeline.lib.io.report.view import minutes_note
    from gpu_pipeline.lib.summary import rfu_minutes, same_minutes

    m = pl.LazyFrame(
        {"gpu_instance_id": [None, None], "gpu_util_pct": [50.0, 70.0], "rfu_pct": [20.0, 30.0]}
    )
    counts = rfu_minutes(m)
    assert counts["both"] == counts["util"] == counts["rfu"] == 2
    assert same_minutes(counts) and minutes_note(counts) is None


# --- 5. a cost that is all unmeasured is not $0.00 of waste ---------------------------------------


def test_mig_tenants_read_unmeasured_not_zero_waste(lake):
    html = html_of(lake)
    price = 2.5 * 2 / 7  # A100-SXM4-40GB: $2.50/h; a 2g.20gb is 2/7 of it, for an hour
    cell = f"<td>unmeasured (${price:,.2f})</td>"
    for section in ("<h2>Namespaces</h2>", "<h2>Top workloads"):
        t = html[html.index(section) :]
        t = t[: t.index("</table>")]
        rows = {r.split("</td>", 1)[0]: r for r in re.findall(r"<tr><td>(.*?)</tr>", t)}
        for ns in ("a", "b", "c"):
            row = rows[f"<bdi>{ns}</bdi>"]
            assert cell in row and "$0.00" not in row, (section, row)


def test_the_summary_says_unmeasured_for_mig_tenants(lake, tmp_path):
    # the summary lists five rows of each: a copy of the day whose money is the MIG tenants'
    copy = tmp_path / "lake"
    shutil.copytree(lake, copy)
    lk = Lake(copy)
    for table in ("priced_waste", "workload_efficiency"):
        rows = lk.read(table, D)
        lk.write(table, D, rows.filter(pl.col("namespace").is_in(["a", "b", "c"])))
    out = summary_of(copy)
    mig = [ln for ln in out.splitlines() if re.match(r"\s+(default/)?[abc][ /]", ln)]
    assert len(mig) == 6, out
    assert all(" waste  unmeasured of " in ln and "$0.00" not in ln for ln in mig), mig
    assert all(ln.endswith(", $0.71 unmeasured)") for ln in mig[:3]), mig  # namespace / model


def test_a_missing_priced_waste_partition_is_named_not_no_price(lake, tmp_path):
    copy = tmp_path / "lake"
    shutil.copytree(lake, copy)
    shutil.rmtree(copy / "priced_waste" / f"date={D}")
    html = html_of(copy)
    assert "cost / day<b>n/a (no priced_waste for this day" in html
    assert "cost / day<b>n/a (no price)" not in html
