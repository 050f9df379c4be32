"""`gpu-pipeline report` tells the report the price book, energy rates and rules in force, as
the pipeline's daily_report does: it called build_report without them, so its appendix said
"The report was not told …", named the shipped prices.csv while GPU_PIPELINE_PRICES pointed at
the user's book, flagged "the day was computed with another price book; materialize it again"
(false), said "No rules file" under GPU_PIPELINE_RULES, and without --out overwrote the
pipeline's correct report of the day with that."""

import html
import re
import shutil
from pathlib import Path

import pytest
from helpers import cli, cli_env

DAY = "2024-01-02"
SHIPPED = Path(__file__).parents[1] / "gpu_pipeline" / "reference" / "prices.csv"
NOT_TOLD = "The report was not told which price book"
ANOTHER_BOOK = "the day was computed with another price book; materialize it again"


def text(page: Path) -> str:
    """What a reader of the page sees: its words, without styles, charts and tags."""
    t = re.sub(r"<(style|svg)[^>]*>.*?</\1>", "", page.read_text(), flags=re.S)
    t = html.unescape(re.sub(r"<[^>]+>", " ", t))
    return re.sub(r"\s+", " ", t).strip()


def appendix(t: str) -> str:
    return t[t.index("Appendix: where the dollars come from") :]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """One day materialized with the user's price book, energy rates and rules file (by their
    variables): (tmp, the environment, the pipeline's report of the day, kept aside)."""
    tmp = tmp_path_factory.mktemp("report26")
    book = tmp / "my prices.csv"
    book.write_text(
        re.sub(r"(?m)^A100-SXM4-40GB,2\.50,", "A100-SXM4-40GB,7.77,", SHIPPED.read_text())
    )
    assert "7.77" in book.read_text()
    energy = tmp / "my energy.csv"
    energy.write_text("cluster,usd_per_kwh,co2_g_per_kwh\n*,0.31,123\n")
    rules = tmp / "rules.toml"
    rules.write_text("[health]\nhot_warn_minutes = 30\n")
    env = cli_env(tmp) | {
        "GPU_PIPELINE_PRICES": str(book),
        "GPU_PIPELINE_ENERGY": str(energy),
        "GPU_PIPELINE_RULES": str(rules),
    }
    cli("generate", "--start", DAY, "--days", "1", "--gpus", "4", "--clusters", "1",
        "--out", str(tmp / "raw"), env=env)  # fmt: skip
    cli("materialize", "--start", DAY, "--raw", str(tmp / "raw"), "--lake", str(tmp / "lake"),
        env=env)  # fmt: skip
    lakes = tmp / "lake" / "_reports" / f"gpu_report_{DAY}.html"
    pipeline = tmp / "pipeline.html"
    shutil.copyfile(lakes, pipeline)
    return tmp, env, pipeline


def test_the_pipelines_report_names_the_users_files(made):
    """The reference the command is held to: the materialized report's appendix."""
    tmp, _, pipeline = made
    ap = appendix(text(pipeline))
    assert f"From your file {tmp / 'my prices.csv'}" in ap and "$7.77" in ap
    assert f"From your file {tmp / 'my energy.csv'}" in ap and "$0.310" in ap
    assert f"From the rules file {tmp / 'rules.toml'} ; 1 rule changed" in ap
    assert NOT_TOLD not in ap and ANOTHER_BOOK not in ap


def test_report_with_the_same_settings_writes_the_pipelines_report(made):
    """With the variables the day was materialized with, `report --out` gives the pipeline's
    page: the same appendix (the user's book, rates and rules file), no "was not told", no
    false "another price book"."""
    tmp, env, pipeline = made
    out = tmp / "cli.html"
    cli("report", "--date", DAY, "--lake", str(tmp / "lake"), "--out", str(out), env=env)
    got, want = text(out), text(pipeline)
    assert appendix(got) == appendix(want)
    assert NOT_TOLD not in got and ANOTHER_BOOK not in got
    assert "No rules file" not in got
    assert got == want  # every section (the rules' thresholds word Health too)
    assert out.read_bytes() == pipeline.read_bytes()


def test_report_without_out_leaves_the_lakes_report_as_the_pipeline_wrote_it(made):
    """Without --out the command rewrites the lake's report of the day: with the same
    settings, into the page the pipeline wrote (not one that disowns the user's book)."""
    tmp, env, pipeline = made
    lakes = tmp / "lake" / "_reports" / f"gpu_report_{DAY}.html"
    p = cli("report", "--date", DAY, "--lake", str(tmp / "lake"), env=env)
    assert p.stdout.startswith(f"wrote {lakes} ("), p.stdout
    assert lakes.read_bytes() == pipeline.read_bytes()


def test_report_takes_prices_as_materialize_does(made):
    """`materialize --prices BOOK` has `report --prices BOOK`: the same page without the
    variable; without either, the shipped book is named and the mismatch is told (truly)."""
    tmp, env, pipeline = made
    book = env["GPU_PIPELINE_PRICES"]
    bare = {k: v for k, v in env.items() if k != "GPU_PIPELINE_PRICES"}
    out = tmp / "flag.html"
    cli("report", "--date", DAY, "--lake", str(tmp / "lake"), "--prices", book, "--out",
        str(out), env=bare)  # fmt: skip
    assert text(out) == text(pipeline)
    # the day was priced with the user's book: the shipped one's 2.50 is another book
    shipped = tmp / "shipped.html"
    cli("report", "--date", DAY, "--lake", str(tmp / "lake"), "--out", str(shipped), env=bare)
    ap = appendix(text(shipped))
    assert NOT_TOLD not in ap
    assert "From the shipped default gpu_pipeline/reference/prices.csv" in ap, ap[:400]
    assert "priced at 7.77 $/h, the price book above says 2.50 $/h: " + ANOTHER_BOOK in ap
