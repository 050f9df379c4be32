"""Dollars a manager can defend: the report of a demo fleet, read in a real headless Chromium
(the way tests/test_browser.py drives it) at 1,280 and 700 px.

A week-like lake: the demo's 50 GPUs for three full days (2024-01-01..03), then 2024-01-04 with
45 GPU-minutes of one GPU, nothing on 01-05, and two hours of that GPU on 01-06.
"""

import json
import re
from datetime import date
from pathlib import Path

import dagster as dg
import pytest
from helpers import MODELS, expo_lines, write_file
from test_browser import _headless

from gpu_pipeline.defs import marts, raw, report, staging
from gpu_pipeline.defs.resources import LakeResource, LandingResource, ReferenceResource
from gpu_pipeline.lib.display import ACTIONS, DIAGNOSES, GROUPS
from gpu_pipeline.lib.generate import generate

FULL, PARTIAL, AFTER_GAP = date(2024, 1, 3), date(2024, 1, 4), date(2024, 1, 6)
LATE = "GPU-0000aaaa-1111-2222-3333-444455556666"

PROBE = """<script>
window.addEventListener('load', () => {
  const hs = [...document.querySelectorAll('h2')];
  const sections = {};
  hs.forEach((h, i) => {
    const r = document.createRange();
    r.setStartBefore(h);
    if (hs[i + 1]) r.setEndBefore(hs[i + 1]); else r.setEndAfter(document.body.lastChild);
    sections[h.textContent] = r.toString();
  });
  const ns = document.querySelector('table.namespaces');
  const box = ns ? ns.parentElement.getBoundingClientRect() : null;
  const out = {
    innerWidth: window.innerWidth,
    scrollWidth: document.documentElement.scrollWidth,
    headings: hs.map(h => h.textContent),
    sections: sections,
    text: document.body.innerText,
    images: [...document.images].map(i => i.alt),
    first: [...document.querySelectorAll('ol.first li')].map(li => li.innerText),
    cells: [...document.querySelectorAll('td')].map(td => td.innerText),
    abbrs: [...document.querySelectorAll('abbr')].map(a => [a.innerText, a.title]),
    // each header of the Namespaces table, and whether it is in view without scrolling its box
    nsHeads: ns ? [...ns.querySelectorAll('th')].map(th => {
      const r = th.getBoundingClientRect();
      return [th.innerText.replace(/\\s+/g, ' '), r.left >= box.left && r.right <= box.right + 0.5];
    }) : [],
  };
  const pre = document.createElement('pre');
  pre.id = 'probe';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


def _probe(page: Path, tmp_path: Path, width: int) -> dict:
    html = page.read_text()
    assert "<script" not in html  # the report itself stays inert and self-contained
    copy = tmp_path / f"{page.stem}_{width}.html"
    copy.write_text(html.replace("<head>", "<head>" + PROBE, 1))
    out = _headless(
        f"--window-size={width},900", "--virtual-time-budget=15000", "--dump-dom", copy.as_uri()
    )
    found = re.search(r'<pre id="probe">(.*?)</pre>', out.stdout, re.S)
    assert found, (out.returncode, out.stdout[-500:], out.stderr[-2000:])
    text = found.group(1).replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">")
    probe = json.loads(text.replace("&amp;", "&"))
    assert probe["innerWidth"] == width and probe["scrollWidth"] <= width, probe["scrollWidth"]
    # nothing a person reads says None or NaN, and nothing counts "1 GPUs"
    assert not re.search(r"\b(None|NaN|nan)\b", probe["text"]), probe["text"]
    assert not re.search(r"(?<![\d,.])1 GPUs", probe["text"])
    return probe


def _materialize(tmp: Path, days: list[date], reference: ReferenceResource) -> Path:
    assets = [raw.ingest, *dg.load_assets_from_modules([staging, marts, report])]
    res = {
        "lake": LakeResource(root=str(tmp / "lake")),
        "landing": LandingResource(root=str(tmp / "raw")),
        "reference": reference,
    }
    instance = dg.DagsterInstance.ephemeral()
    for d in days:
        assert dg.materialize(
            assets, partition_key=d.isoformat(), resources=res, instance=instance
        ).success
    return tmp / "lake" / "_reports"


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("manager")
    generate(tmp / "raw", date(2024, 1, 1), days=3, gpus=50, clusters=3, seed=42)
    # one A100 of vision-train, busy at full power: 45 minutes on 01-04, two hours on 01-06
    for d, minutes in ((PARTIAL, range(600, 645)), (AFTER_GAP, range(600, 720))):
        lines = expo_lines(
            LATE, MODELS["A100"], "late-node-00", "vision-train", d, minutes, 95, 320
        )
        write_file(tmp / "raw" / "late" / f"late-node-00_{d}.prom", lines)
    days = [date(2024, 1, 1), date(2024, 1, 2), FULL, PARTIAL, AFTER_GAP]
    return _materialize(tmp, days, ReferenceResource())


def _page(reports: Path, d: date) -> Path:
    return reports / f"gpu_report_{d}.html"


def test_what_to_do_first_ranks_recoverable_waste_and_spot_stands_apart(reports, tmp_path):
    """The demo's #1 was "spot for llm-pretrain: about $11,578 a month", its most efficient
    namespace, beside an unlabeled daily "$649.92": now the list is waste (how the GPUs are used)
    by $/month, spot has its own section, and every dollar says its period."""
    probe = _probe(_page(reports, FULL), tmp_path, 1280)
    assert probe["headings"][:2] == ["What to do first", "Paying less for the same work"]
    first = probe["first"]
    assert len(first) == 3
    spot = ACTIONS["spot"]
    assert not any(item.startswith(spot) for item in first), first
    # each item: about $N/month, the most first; every other dollar in it is labeled too
    amounts = [
        float(re.search(r"about \$([\d,]+)/month", i).group(1).replace(",", "")) for i in first
    ]
    assert amounts == sorted(amounts, reverse=True) and amounts[0] > 1000, first
    waste = probe["sections"]["What to do first"]
    assert not re.findall(r"\$[\d,]+(?:\.\d+)?(?![\d.,]|/day|/month)", waste), waste
    assert "A month is 30 days like this one" in waste
    # spot, per namespace, in $/month on the cost left after the waste actions
    price = probe["sections"]["Paying less for the same work"]
    assert "spot saves $/month" in price and "after the waste actions $/day" in price
    assert re.search(r"llm-pretrain\$[\d,]+/month\d+ %", price), price
    # the health section no longer warns for a minute's spike
    health = probe["sections"]["Health"]
    assert "50 of 50 GPUs ok" in health and "A GPU warns after 15 minutes" in health
    assert "1 min at or above" not in health


def test_the_appendix_shows_the_prices_rates_and_rules_in_force(reports, tmp_path):
    """The $/GPU-hour of each model the day ran, from which file and line of the price book
    (with its source), the energy rates of its clusters and every rule."""
    probe = _probe(_page(reports, FULL), tmp_path, 1280)
    appendix = probe["sections"]["Appendix: where the dollars come from"]
    assert "From the shipped default gpu_pipeline/reference/prices.csv" in appendix
    rows = {c for c in probe["cells"]}
    for model, price, spot in (
        ("NVIDIA A100-SXM4-40GB", "$2.50", "$1.00"),
        ("NVIDIA H100 80GB HBM3", "$4.00", "$1.80"),
        ("NVIDIA A10G", "$1.01", "$0.40"),
    ):
        assert re.search(rf"{re.escape(model)}[\d,.]+{re.escape(price + spot)}", appendix), model
    assert any(c.startswith("AWS g5.xlarge on-demand us-east-1") for c in rows)  # `source`
    assert "Energy rates" in appendix and "$0.120400the * row (every other cluster)" in appendix
    assert "No rules file: the defaults; 0 rules changed" in appendix
    assert "hot_warn_minutes = 15" in appendix and "month_from = 50" in appendix


def test_the_appendix_names_the_users_price_book_and_rules(tmp_path):
    """A price book of the user's (GPU_PIPELINE_PRICES) and a rules file: the report names
    them, prints the book's row and each changed rule beside its default."""
    generate(tmp_path / "raw", FULL, days=1, gpus=4, clusters=1, seed=3)
    book = tmp_path / "my prices.csv"
    shipped = Path(__file__).parents[1] / "gpu_pipeline" / "reference" / "prices.csv"
    book.write_text(
        "gpu_model,on_demand_usd_per_hour,spot_usd_per_hour,source\n"
        + "\n".join(
            f"{line.split(',')[0]},9.99,,our contract 2024"
            for line in shipped.read_text().splitlines()[6:]
        )
        + "\n"
    )
    rules = tmp_path / "rules.toml"
    rules.write_text("[health]\nhot_warn_minutes = 30\n")
    out = _materialize(tmp_path, [FULL], ReferenceResource(prices=str(book), rules=str(rules)))
    probe = _probe(_page(out, FULL), tmp_path, 1280)
    appendix = probe["sections"]["Appendix: where the dollars come from"]
    assert f"From your file {book}" in appendix
    assert "$9.99none" in appendix and "our contract 2024" in appendix
    assert f"From the rules file {rules}; 1 rule changed" in appendix
    assert "hot_warn_minutes = 30 (default 15)" in appendix
    assert "A GPU warns after 30 minutes" in probe["sections"]["Health"]
    # no spot price in this book: nothing to say about paying less
    assert "Paying less for the same work" not in probe["headings"]


@pytest.mark.parametrize("width", [1280, 700])
def test_a_partial_day_says_what_its_figures_rest_on(reports, tmp_path, width):
    """45 GPU-minutes of one GPU after a full week recommended "spot … about $34 a month", drew
    an empty bottlenecks plot and empty ROI bars, and listed 10 persistent bottlenecks that sent
    nothing that day next to "GPUs 1"."""
    probe = _probe(_page(reports, PARTIAL), tmp_path, width)
    text = probe["text"]
    assert "Partial data: this day's telemetry covers 3.1 % of its GPU-minutes" in text
    assert "(1 GPU seen × 1,440 minutes)" in text and "1 of 1 GPU has gaps" in text
    # no month extrapolated from 45 minutes: the observed day's dollars, and why
    first = probe["sections"]["What to do first"]
    assert "Not projected to a month: only 3.1 % of the day's GPU-minutes (45 of 1,440)" in first
    assert "/month" not in first and all("/day" in i for i in probe["first"]), probe["first"]
    assert "/month" not in probe["sections"]["Paying less for the same work"]
    assert "/month" not in probe["sections"]["Recommendations"]
    # no empty charts: their title and why, not a plot
    assert "Bottlenecked GPUs" not in probe["images"] and "Efficiency ROI" not in probe["images"]
    bottlenecks = probe["sections"]["Bottlenecked GPUs"]
    assert "No GPU had a bottlenecked minute (utilization >= 70 %, PIF < 0.4) on this day" in (
        bottlenecks
    )
    assert "Nothing to gain by raising RFU to 60 %" in probe["sections"]["Efficiency ROI"]
    # the persistent bottlenecks say they were not seen this day
    assert "10 of these 10 GPUs sent no data on this day" in bottlenecks
    assert bottlenecks.count("not seen: no data this day") == 10


def test_the_trend_draws_days_without_data_as_gaps(reports, tmp_path):
    """01-04 (45 minutes) and 01-06 were drawn side by side as if adjacent: 01-05 is a gap,
    01-04 says how little of it was observed."""
    probe = _probe(_page(reports, AFTER_GAP), tmp_path, 1280)
    trend = probe["sections"]["Fleet trend"]
    assert "days without data (01-05)" in trend
    assert "2024-01-05no datano datano datano datano data" in trend.replace("\n", "")
    assert re.search(r"2024-01-0445\s*3\.1 %", trend), trend
    assert re.search(r"2024-01-03[\d,]+100\.0 %", trend)


def test_tables_read_as_words_and_the_money_shows_first_at_700_px(reports, tmp_path):
    """`idle_wallclock`, `rate`, `kernels`, `communication_bound`, `data_starved` in the tables
    a manager reads: labels now, the code in a tooltip; the Namespaces table hid waste and
    energy behind a horizontal scroll at 700 px."""
    probe = _probe(_page(reports, FULL), tmp_path, 700)
    codes = set(ACTIONS) - {"DALI", "MPS", "MIG", "AMP", "BF16", "FP8"} | set(GROUPS)
    codes |= set(DIAGNOSES) - {"idle", "mixed"}
    shown = [c for c in probe["cells"] if c in codes or re.fullmatch(r"[a-z]+_[a-z_]+", c)]
    assert shown == [], shown
    titles = {t for _, t in probe["abbrs"]}
    for code in ("idle_wallclock", "rate", "kernels", "data_starved", "right_size", "spot"):
        assert f"code: {code}" in titles, code
    assert [GROUPS["idle_wallclock"], "code: idle_wallclock"] in probe["abbrs"]
    heads = dict(probe["nsHeads"])
    assert list(heads)[:4] == ["namespace", "cost $/day", "waste $/day", "energy $/day"]
    assert all(heads[h] for h in list(heads)[:4]), probe["nsHeads"]
    assert not all(heads.values())  # the rest scrolls inside the table's own box
