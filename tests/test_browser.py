"""The daily report as a person sees it: rendered in a real headless Chromium (Debian package
`chromium`; `make test` installs it when missing), 1,280 px wide.

A probe script injected into a copy of the report records what the page did (errors, images,
layout) and `--dump-dom` hands it back; the report itself carries no script.
"""

import json
import re
import shutil
import subprocess
from datetime import date

import dagster as dg
import pytest

from gpu_pipeline.defs import marts, raw, report, staging
from gpu_pipeline.defs.resources import LakeResource, LandingResource, ReferenceResource
from gpu_pipeline.lib.generate import generate

D0 = date(2024, 5, 6)

PROBE = """<script>
window.__errors = [];
window.addEventListener('error', e => {
  window.__errors.push(e.message || ('failed to load ' + ((e.target && (e.target.src || e.target.href)) || '?').slice(0, 80)));
}, true);
const __ce = console.error;
console.error = (...a) => { window.__errors.push(a.join(' ')); __ce(...a); };
window.addEventListener('load', () => {
  const imgs = [...document.images].map(img => {
    const c = document.createElement('canvas');
    c.width = 64; c.height = 64;
    const g = c.getContext('2d');
    let colors = 0;
    if (img.complete && img.naturalWidth > 0) {
      g.drawImage(img, 0, 0, 64, 64);
      const d = g.getImageData(0, 0, 64, 64).data;
      const seen = new Set();
      for (let i = 0; i < d.length; i += 4) seen.add(d[i] + ',' + d[i + 1] + ',' + d[i + 2]);
      colors = seen.size;
    }
    return {alt: img.alt, width: img.naturalWidth, height: img.naturalHeight, colors: colors};
  });
  const out = {
    errors: window.__errors,
    images: imgs,
    scrollWidth: document.documentElement.scrollWidth,
    innerWidth: window.innerWidth,
    headings: [...document.querySelectorAll('h2')].map(h => h.textContent),
    firstActions: document.querySelectorAll('ol.first li').length,
    // print layout: the selectors the print stylesheet keeps whole on a page
    printWhole: [...document.styleSheets].flatMap(sh => [...sh.cssRules])
      .filter(r => r.media && r.media.mediaText === 'print')
      .flatMap(r => [...r.cssRules])
      .filter(r => r.style && r.style.breakInside === 'avoid')
      .flatMap(r => r.selectorText.split(',').map(x => x.trim())),
    charts: [...document.querySelectorAll('div.chart')].map(d =>
      d.querySelectorAll('h2').length + d.querySelectorAll('img').length),
    // a table wider than the page scrolls inside its own box, not the page
    tablesOutsideScroll: [...document.querySelectorAll('table')]
      .filter(t => !t.parentElement.classList.contains('scroll')).length,
  };
  const pre = document.createElement('pre');
  pre.id = 'probe';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.fail(
        "chromium is not installed: `make test` installs it (apt-get install -y chromium); the "
        "report is checked in a real browser, not skipped"
    )


@pytest.fixture(scope="module")
def report_html(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("browser")
    generate(tmp / "raw", D0, days=2, gpus=6, clusters=2, seed=5)
    assets = [raw.ingest, *dg.load_assets_from_modules([staging, marts, report])]
    res = {
        "lake": LakeResource(root=str(tmp / "lake")),
        "landing": LandingResource(root=str(tmp / "raw")),
        "reference": ReferenceResource(),
    }
    instance = dg.DagsterInstance.ephemeral()
    for day in ("2024-05-06", "2024-05-07"):
        assert dg.materialize(assets, partition_key=day, resources=res, instance=instance).success
    return tmp / "lake" / "_reports" / "gpu_report_2024-05-07.html"


def _headless(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _probe(html: str, tmp_path, width: int) -> dict:
    page = tmp_path / f"probe_{width}.html"
    page.write_text(html.replace("<head>", "<head>" + PROBE, 1))
    out = _headless(
        f"--window-size={width},900", "--virtual-time-budget=15000", "--dump-dom", page.as_uri()
    )
    found = re.search(r'<pre id="probe">(.*?)</pre>', out.stdout, re.S)
    assert found, (out.returncode, out.stdout[-500:], out.stderr[-2000:])
    return json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))


def test_the_report_renders_whole_in_a_real_browser(report_html, tmp_path):
    html = report_html.read_text()
    assert "<script" not in html  # self-contained and inert
    probe = _probe(html, tmp_path, 1280)
    assert probe["errors"] == []
    # every chart decodes and is not blank (a plot has many colors; a blank image has one)
    assert len(probe["images"]) >= 6
    for img in probe["images"]:
        assert img["width"] > 100 and img["height"] > 100, img
        assert img["colors"] > 8, img
    # no horizontal scrolling at 1,280 px
    assert probe["innerWidth"] == 1280 and probe["scrollWidth"] <= 1280, probe
    # what to do first comes first, with its actions
    assert probe["headings"][0] == "What to do first" and probe["firstActions"] >= 1
    assert "Fleet trend" in probe["headings"] and "Namespaces" in probe["headings"]


def test_the_report_fits_a_laptop_and_a_phone_and_prints_whole(report_html, tmp_path):
    """At 700 px nothing scrolls the page sideways (wide tables scroll in their own box); the
    print stylesheet keeps each chart with its title and caption, and table rows, whole; Chromium
    prints the report to a PDF."""
    html = report_html.read_text()
    probe = _probe(html, tmp_path, 700)
    assert probe["errors"] == []
    assert probe["innerWidth"] == 700 and probe["scrollWidth"] <= 700, probe
    assert probe["tablesOutsideScroll"] == 0
    assert len(probe["charts"]) == len(probe["images"]) and set(probe["charts"]) == {2}
    assert {".chart", "tr", "img"} <= set(probe["printWhole"]), probe["printWhole"]
    pdf = tmp_path / "report.pdf"
    out = _headless(f"--print-to-pdf={pdf}", "--no-pdf-header-footer", report_html.as_uri())
    assert pdf.is_file(), out.stderr[-2000:]
    data = pdf.read_bytes()
    assert data.startswith(b"%PDF")
    assert len(re.findall(rb"/Type\s*/Page[^s]", data)) >= 3
