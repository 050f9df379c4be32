"""GPU catalog and price book: SPEC values, model-name matching, overrides, and the shipped
files' own consistency."""

import math
from datetime import UTC, date, datetime

import dagster as dg
import polars as pl
import pytest

from gpu_pipeline.definitions import build_definitions
from gpu_pipeline.lib.reference import (
    CATALOG_SCHEMA,
    DEFAULT_CATALOG,
    DEFAULT_PRICES,
    PRICES_SCHEMA,
    ReferenceError,
    load_catalog,
    load_prices,
    model_key,
)
from gpu_pipeline.lib.samples import conform
from gpu_pipeline.lib.schemas import GPU_SAMPLES_SCHEMA
from gpu_pipeline.lib.staging.gpu_minutes import gpu_minutes


def key(name: str) -> str:
    return pl.select(model_key(pl.lit(name))).item()


def test_catalog_has_spec_values_and_common_gpus():
    cat = load_catalog()
    rows = {r["gpu_model"]: r for r in cat.iter_rows(named=True)}
    assert (
        rows["A100-SXM4-40GB"]["max_power_w"],
        rows["A100-SXM4-40GB"]["theoretical_fp16_tflops"],
        rows["A100-SXM4-40GB"]["achievable_fp16_tflops"],
    ) == (400, 312, 102)
    assert (
        rows["H100 80GB HBM3"]["max_power_w"],
        rows["H100 80GB HBM3"]["theoretical_fp16_tflops"],
        rows["H100 80GB HBM3"]["achievable_fp16_tflops"],
    ) == (700, 1979, 646)
    assert (
        rows["A10G"]["max_power_w"],
        rows["A10G"]["theoretical_fp16_tflops"],
        rows["A10G"]["achievable_fp16_tflops"],
    ) == (300, 125, 35)
    keys = set(cat["model_key"])
    for m in [
        "Tesla V100-SXM2-16GB",
        "Tesla T4",
        "NVIDIA A10",
        "NVIDIA L4",
        "NVIDIA L40S",
        "NVIDIA A100-SXM4-80GB",
        "NVIDIA A100-PCIE-40GB",
        "NVIDIA A100 80GB PCIe",
        "NVIDIA H100 PCIe",
        "NVIDIA H100 NVL",
        "NVIDIA H200",
        "NVIDIA B200",
    ]:
        assert pl.select(model_key(pl.lit(m))).item() in keys, m
    assert cat["source"].is_not_null().all() and (cat["idle_power_w"] < cat["max_power_w"]).all()
    assert (cat["achievable_fp16_tflops"] < cat["theoretical_fp16_tflops"]).all()


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("NVIDIA A100-SXM4-40GB", "A100-SXM4-40GB"),
        ("nvidia h100 80gb hbm3", "H100 80GB HBM3"),
        ("Tesla T4", "T4"),
        ("NVIDIA  A10G ", "A10G"),
        ("A100_SXM4_40GB", "a100 sxm4 40gb"),
    ],
)
def test_model_key_matches_name_variants(a, b):
    assert pl.select(model_key(pl.lit(a))).item() == pl.select(model_key(pl.lit(b))).item()


def test_price_book_override_and_catalog_extension(tmp_path, monkeypatch):
    prices = tmp_path / "p.csv"
    prices.write_text(
        "gpu_model,on_demand_usd_per_hour,spot_usd_per_hour\nNVIDIA H100 80GB HBM3,9.99,3\n"
    )
    row = load_prices(prices).row(0, named=True)
    # the three-column price book still loads: `source` is optional (null when absent)
    assert row["on_demand_usd_per_hour"] == 9.99 and row["source"] is None
    sourced = tmp_path / "sourced.csv"
    sourced.write_text(
        "gpu_model,on_demand_usd_per_hour,spot_usd_per_hour,source,region\n"
        "NVIDIA L4,0.7,0.3,our contract,eu-west\n"
    )
    assert load_prices(sourced).row(0, named=True)["source"] == "our contract"
    extra = tmp_path / "c.csv"
    extra.write_text(
        "gpu_model,max_power_w,idle_power_w,theoretical_fp16_tflops,achievable_fp16_tflops,source\n"
        "Mystery X,500,50,1000,300,our lab\nA10G,250,25,125,30,measured\n"
    )
    cat = {r["gpu_model"]: r for r in load_catalog(extra).iter_rows(named=True)}
    assert cat["Mystery X"]["max_power_w"] == 500 and cat["A10G"]["max_power_w"] == 250
    # the variables reach the functions through the resources, bound as EnvVars
    monkeypatch.setenv("GPU_PIPELINE_PRICES", str(prices))
    monkeypatch.setenv("GPU_PIPELINE_CATALOG", str(extra))
    ref = build_definitions().resources["reference"]
    assert ref.prices == dg.EnvVar("GPU_PIPELINE_PRICES")
    with dg.build_resources({"reference": ref}) as r:
        assert r.reference.load_prices().height == 1
        assert "Mystery X" in r.reference.load_catalog()["gpu_model"].to_list()
    assert load_prices().height > 1  # lib/ never reads the environment: the shipped book


def test_bad_reference_files_fail_clearly(tmp_path):
    with pytest.raises(ReferenceError, match="not found"):
        load_prices(tmp_path / "missing.csv")
    bad = tmp_path / "bad.csv"
    bad.write_text("gpu_model,on_demand_usd_per_hour\nA10G,1\n")
    with pytest.raises(ReferenceError, match="lacks column"):
        load_prices(bad)
    dup = tmp_path / "dup.csv"
    dup.write_text(
        "gpu_model,on_demand_usd_per_hour,spot_usd_per_hour\nA10G,1,0.5\nNVIDIA A10G,2,1\n"
    )
    with pytest.raises(ReferenceError, match="twice"):
        load_prices(dup)


# --- real model names as exporters spell them ------------------------------------------------

# (the data's modelName / nvidia-smi name, the catalog row it must land on)
REAL_NAMES = [
    ("NVIDIA H100 80GB HBM3", "H100 80GB HBM3"),
    ("NVIDIA H200", "H200"),
    ("NVIDIA H200 NVL", "H200 NVL"),
    ("NVIDIA H20", "H20"),
    ("NVIDIA GH200 480GB", "GH200 480GB"),
    ("NVIDIA GH200 144G HBM3e", "GH200 144G HBM3e"),
    ("NVIDIA B200", "B200"),
    ("NVIDIA GB200", "GB200"),
    ("NVIDIA A800-SXM4-80GB", "A800-SXM4-80GB"),
    ("NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB"),
    ("NVIDIA L4", "L4"),
    ("NVIDIA L40", "L40"),
    ("NVIDIA L40S", "L40S"),
    ("NVIDIA A10", "A10"),
    ("NVIDIA A10G", "A10G"),
    ("NVIDIA A30", "A30"),
    ("NVIDIA A40", "A40"),
    ("Tesla T4", "Tesla T4"),
    ("Tesla V100-SXM2-32GB", "Tesla V100-SXM2-32GB"),
    ("Tesla V100S-PCIE-32GB", "Tesla V100S-PCIE-32GB"),
    ("NVIDIA RTX 6000 Ada Generation", "RTX 6000 Ada Generation"),
    ("NVIDIA RTX 4000 Ada Generation", "RTX 4000 Ada Generation"),
    ("NVIDIA RTX 4000 SFF Ada Generation", "RTX 4000 SFF Ada Generation"),
    ("NVIDIA RTX A6000", "RTX A6000"),
    ("NVIDIA RTX A5000", "RTX A5000"),
    ("NVIDIA RTX A4000", "RTX A4000"),
    ("NVIDIA GeForce RTX 4090", "GeForce RTX 4090"),
    ("NVIDIA GeForce RTX 3090", "GeForce RTX 3090"),
    ("NVIDIA GeForce RTX 2080 Ti", "GeForce RTX 2080 Ti"),
]


@pytest.mark.parametrize(("name", "row"), REAL_NAMES)
def test_real_model_names_land_on_their_row_with_a_price(name, row):
    cat, prices = load_catalog(), load_prices()
    hits = cat.filter(pl.col("model_key") == key(name))
    assert hits["gpu_model"].to_list() == [row]
    assert prices.filter(pl.col("model_key") == key(name)).height == 1


@pytest.mark.parametrize(
    ("name", "tdp", "mig", "bf16", "fp8"),
    [
        ("NVIDIA H200", 700, 7, True, True),
        ("NVIDIA H20", 400, 7, True, True),
        ("NVIDIA B200", 1000, 7, True, True),
        ("NVIDIA L4", 72, None, True, True),
        ("NVIDIA A30", 165, 4, True, False),
        ("NVIDIA A40", 300, None, True, False),
        ("NVIDIA GeForce RTX 4090", 450, None, True, True),
        ("NVIDIA RTX 4000 Ada Generation", 130, None, True, True),
        ("Tesla T4", 70, None, False, False),
        ("Tesla V100-SXM2-32GB", 300, None, False, False),
    ],
)
def test_catalog_values_of_common_gpus(name, tdp, mig, bf16, fp8):
    r = load_catalog().filter(pl.col("model_key") == key(name)).row(0, named=True)
    assert (r["max_power_w"], r["mig_slices"], r["bf16"], r["fp8"]) == (tdp, mig, bf16, fp8)


# --- vGPU profiles: kept, never mapped onto their board ----------------------------------------

VGPU_NAMES = [
    "GRID A100-40C",
    "GRID A100-20C",
    "NVIDIA A100-40C",
    "GRID V100-16Q",
    "GRID T4-16Q",
    "NVIDIA L4-24Q",
    "NVIDIA A10-24Q",
]


@pytest.mark.parametrize("name", VGPU_NAMES)
def test_vgpu_profiles_match_no_catalog_row_or_price(name):
    assert key(name) not in set(load_catalog()["model_key"])
    assert key(name) not in set(load_prices()["model_key"])


def test_vgpu_minutes_are_kept_with_the_reason():
    t0 = datetime(2024, 1, 1, tzinfo=UTC)
    base = {"date": date(2024, 1, 1), "cluster": "c", "source_file": "f", "hostname": "h"}
    rows = [
        # the samples' GRID A100-40C: utilization, no power reading
        {
            **base,
            "gpu_uuid": "GPU-v",
            "timestamp": t0,
            "gpu_util_pct": 40.0,
            "gpu_model": "GRID A100-40C",
        },
        {
            **base,
            "gpu_uuid": "GPU-p",
            "timestamp": t0,
            "gpu_util_pct": 40.0,
            "power_w": 200.0,
            "gpu_model": "NVIDIA A100-SXM4-40GB",
        },
    ]
    s = conform(pl.DataFrame(rows), GPU_SAMPLES_SCHEMA).lazy()
    m = {
        r["gpu_uuid"]: r for r in gpu_minutes(s, load_catalog(), load_prices()).collect().to_dicts()
    }
    v = m["GPU-v"]
    assert v["gpu_util_pct"] == 40.0 and v["phase"] == "underutilized"
    assert v["achievable_tflops"] is None and v["price_usd_per_hour"] is None
    assert v["pif"] is None and v["max_power_w"] is None
    assert "model 'GRID A100-40C' not in GPU catalog" in v["note"] and "no price" in v["note"]
    # the physical board of the same day is priced and has its PIF
    assert m["GPU-p"]["achievable_tflops"] == 102 and m["GPU-p"]["pif"] == 0.5


# --- the shipped files are consistent ----------------------------------------------------------

NUMERIC = ["max_power_w", "idle_power_w", "theoretical_fp16_tflops", "achievable_fp16_tflops"]
PRICE_COLS = ["on_demand_usd_per_hour", "spot_usd_per_hour"]


def reference_problems(cat: pl.DataFrame, prices: pl.DataFrame) -> list[str]:
    """What is wrong with a catalog and price book as shipped (empty: nothing)."""
    out = []
    for what, df, cols in (("catalog", cat, NUMERIC), ("prices", prices, PRICE_COLS)):
        for c in cols:
            bad = [
                r["gpu_model"]
                for r in df.select("gpu_model", c).iter_rows(named=True)
                if r[c] is None or not math.isfinite(r[c]) or r[c] < 0
            ]
            if bad:
                out.append(f"{what}.{c} not a finite number >= 0: {bad}")
        for k, n in df.group_by("model_key").len().filter(pl.col("len") > 1).iter_rows():
            out.append(f"{what} lists {k} {n} times")
        empty = df.filter(pl.col("source").is_null() | (pl.col("source").str.strip_chars() == ""))
        if empty.height:
            out.append(f"{what} rows without a source: {empty['gpu_model'].to_list()}")
    rows = cat.to_dicts()
    out += [f"{r['gpu_model']}: max power not > 0" for r in rows if not r["max_power_w"] > 0]
    out += [
        f"{r['gpu_model']}: idle >= max power"
        for r in rows
        if not r["idle_power_w"] < r["max_power_w"]
    ]
    out += [
        f"{r['gpu_model']}: achievable > theoretical"
        for r in rows
        if not 0 < r["achievable_fp16_tflops"] <= r["theoretical_fp16_tflops"]
    ]
    out += [
        f"{r['gpu_model']}: mig_slices {r['mig_slices']}"
        for r in rows
        if r["mig_slices"] not in (None, 4, 7)
    ]
    out += [
        f"{r['gpu_model']}: bf16/fp8 unset or fp8 without bf16"
        for r in rows
        if r["bf16"] is None or r["fp8"] is None or (r["fp8"] and not r["bf16"])
    ]
    unpriced = set(cat["model_key"]) - set(prices["model_key"])
    uncataloged = set(prices["model_key"]) - set(cat["model_key"])
    if unpriced:
        out.append(f"catalog models without a price: {sorted(unpriced)}")
    if uncataloged:
        out.append(f"priced models not in the catalog: {sorted(uncataloged)}")
    for r in prices.to_dicts():
        if not r["on_demand_usd_per_hour"] > 0:
            out.append(f"{r['gpu_model']}: on-demand price not > 0")
        if not r["spot_usd_per_hour"] <= r["on_demand_usd_per_hour"]:
            out.append(f"{r['gpu_model']}: spot above on-demand")
    return out


def test_shipped_files_have_exactly_the_known_columns():
    for path, schema in ((DEFAULT_CATALOG, CATALOG_SCHEMA), (DEFAULT_PRICES, PRICES_SCHEMA)):
        header = pl.read_csv(path, comment_prefix="#", n_rows=0).columns
        assert header == list(schema), path


def test_shipped_catalog_and_price_book_are_consistent():
    cat, prices = load_catalog(), load_prices()
    assert reference_problems(cat, prices) == []
    assert cat.height >= 38 and prices.height == cat.height


@pytest.mark.parametrize(
    ("table", "model", "column", "value", "problem"),
    [
        ("cat", "A10G", "max_power_w", -300.0, "max_power_w not a finite number"),
        ("cat", "A10G", "idle_power_w", float("nan"), "idle_power_w not a finite number"),
        ("cat", "A10G", "theoretical_fp16_tflops", float("inf"), "not a finite number"),
        ("cat", "A10G", "achievable_fp16_tflops", 126.0, "achievable > theoretical"),
        ("cat", "A10G", "idle_power_w", 300.0, "idle >= max power"),
        ("cat", "A10G", "mig_slices", 3, "mig_slices 3"),
        ("cat", "A10G", "bf16", False, "fp8 without bf16"),
        ("cat", "A10G", "source", "", "without a source"),
        ("cat", "A10G", "model_key", "L4", "lists L4 2 times"),
        ("prices", "A10G", "spot_usd_per_hour", 1.5, "spot above on-demand"),
        ("prices", "A10G", "on_demand_usd_per_hour", 0.0, "on-demand price not > 0"),
        ("prices", "A10G", "source", None, "without a source"),
        ("prices", "A10G", "model_key", "MYSTERY", "without a price"),
    ],
)
def test_reference_checks_catch_each_problem(table, model, column, value, problem):
    cat, prices = load_catalog(), load_prices()
    if column == "bf16":  # an fp8 part without bf16
        cat = cat.with_columns(
            pl.when(pl.col("gpu_model") == model).then(True).otherwise(pl.col("fp8")).alias("fp8")
        )
    df = cat if table == "cat" else prices
    dtype = df.schema[column]
    df = df.with_columns(
        pl.when(pl.col("gpu_model") == model)
        .then(pl.lit(value, dtype))
        .otherwise(pl.col(column))
        .alias(column)
    )
    cat, prices = (df, prices) if table == "cat" else (cat, df)
    problems = reference_problems(cat, prices)
    assert any(problem in p for p in problems), problems


# --- every cell checked: one line per problem, naming the file, the line and the column --------

PRICE_HEAD = "gpu_model,on_demand_usd_per_hour,spot_usd_per_hour\n"
CAT_HEAD = "gpu_model,max_power_w,idle_power_w,theoretical_fp16_tflops,achievable_fp16_tflops\n"
_PRICE = "(allowed: a finite number from 0 to 1,000, USD per GPU-hour)"
_SPOT = "(allowed: a finite number from 0 to 1,000, USD per GPU-hour, or empty (no spot price))"


@pytest.mark.parametrize(
    ("kind", "text", "problems"),
    [
        (
            "prices",
            PRICE_HEAD + "# ours\nA10G,-1e6,0.4\nL4,inf,\nH200,abc,-0.1\n",
            [
                f"line 3, on_demand_usd_per_hour='-1e6': negative {_PRICE}",
                f"line 4, on_demand_usd_per_hour='inf': not finite {_PRICE}",
                f"line 5, on_demand_usd_per_hour='abc': not a number {_PRICE}",
                f"line 5, spot_usd_per_hour='-0.1': negative {_SPOT}",
            ],
        ),
        (
            "prices",
            PRICE_HEAD + "A10G,,0.4\n",
            [f"line 2, on_demand_usd_per_hour='': not a number {_PRICE}"],
        ),
        (  # a price past any GPU's (1.7e308 made every cost infinite): a unit mistake
            "prices",
            PRICE_HEAD + "A10G,1.7e308,0.4\nL4,1800,2000.5\n",
            [
                "line 2, on_demand_usd_per_hour='1.7e308': above 1,000: a price per month or "
                f"per year, or in cents? USD per GPU-hour {_PRICE}",
                "line 3, on_demand_usd_per_hour='1800': above 1,000: a price per month or per "
                f"year, or in cents? USD per GPU-hour {_PRICE}",
                "line 3, spot_usd_per_hour='2000.5': above 1,000: a price per month or per "
                f"year, or in cents? USD per GPU-hour {_SPOT}",
            ],
        ),
        ("prices", PRICE_HEAD + "A10G,1\n", ["line 2: 2 fields, the header has 3"]),
        (  # a misspelt column is not taken for a column of the user's own
            "prices",
            "gpu_model,on_demand_usd_per_hour,spot_usd_per_hr\nA10G,1,0.5\n",
            [
                "line 1: unknown column 'spot_usd_per_hr' (did you mean spot_usd_per_hour? "
                "allowed: gpu_model, on_demand_usd_per_hour, spot_usd_per_hour, source)",
                "line 1: lacks column(s) ['spot_usd_per_hour']; expected ['gpu_model', "
                "'on_demand_usd_per_hour', 'spot_usd_per_hour'] (optional: ['source'])",
            ],
        ),
        (
            "catalog",
            CAT_HEAD.strip() + ",mig_slice\nX1,300,10,100,30,7\n",
            [
                "line 1: unknown column 'mig_slice' (did you mean mig_slices? allowed: "
                "gpu_model, max_power_w, idle_power_w, theoretical_fp16_tflops, "
                "achievable_fp16_tflops, mig_slices, bf16, fp8, source)"
            ],
        ),
        (
            "prices",
            PRICE_HEAD + "A10G,1,0.5\nL4,1,0.5\nNVIDIA A10G,2,1\n",
            ["line 4, gpu_model='NVIDIA A10G': lists A10G twice (first on line 2; one row each)"],
        ),
        (
            "catalog",
            CAT_HEAD + "X1,0,10,100,30\nX2,300,-5,nan,30\n",
            [
                "line 2, max_power_w='0': zero (allowed: a finite number of watts > 0, or empty "
                "(the power limit seen is used))",
                "line 3, idle_power_w='-5': negative (allowed: a finite number of watts >= 0, or "
                "empty)",
                "line 3, theoretical_fp16_tflops='nan': not finite (allowed: a finite number >= 0, "
                "or empty (unknown))",
            ],
        ),
        (
            "catalog",
            CAT_HEAD.strip() + ",mig_slices,bf16\nX1,300,10,100,30,9,yes\n",
            [
                "line 2, mig_slices='9': out of range (allowed: a whole number from 1 to 7, or "
                "empty (no MIG))",
                "line 2, bf16='yes': not true or false (allowed: true, false or empty)",
            ],
        ),
        (
            "energy",
            "cluster,usd_per_kwh,co2_g_per_kwh\n*,0.12,400\neast,-0.1,400\n*,1,1\n",
            [
                "line 3, usd_per_kwh='-0.1': negative (allowed: a finite number from 0 to 100, USD per kWh)",
            ],
        ),
        (
            "energy",
            "cluster,usd_per_kwh,co2_g_per_kwh\n*,0.12,400\n*,1,1\n",
            ["line 3, cluster='*': lists * twice (first on line 2; one row each)"],
        ),
    ],
)
def test_each_bad_cell_is_one_line_naming_file_line_and_column(tmp_path, kind, text, problems):
    from gpu_pipeline.lib.reference import check_files

    f = tmp_path / f"{kind}.csv"
    f.write_text(text)
    what = {"prices": "price book", "catalog": "GPU catalog", "energy": "energy rates"}[kind]
    with pytest.raises(ReferenceError) as e:
        check_files(**{kind: f})
    assert e.value.problems == [f"{what} {f} {p}" if p.startswith("line") else p for p in problems]
    assert str(e.value).splitlines() == e.value.problems


def test_odd_but_possible_values_are_warnings():
    """A column of the user's own (ignored), a spot price above on-demand (a real book can have
    one: no spot saving is proposed), achievable TFLOPS above theoretical, idle power at or above
    max: warnings, the run goes on."""
    import tempfile
    from pathlib import Path

    from gpu_pipeline.lib.reference import check_files

    with tempfile.TemporaryDirectory() as d:
        prices, cat = Path(d) / "p.csv", Path(d) / "c.csv"
        prices.write_text(PRICE_HEAD.strip() + ",region\nA10G,1.01,1.5,eu-west\n")
        cat.write_text(CAT_HEAD + "X1,300,300,100,130\n")
        assert check_files(prices=prices, catalog=cat) == [
            f"price book {prices} line 1: column 'region' is not one the pipeline reads: ignored "
            "(known: gpu_model, on_demand_usd_per_hour, spot_usd_per_hour, source)",
            f"price book {prices} line 2, spot_usd_per_hour=1.5: above on_demand_usd_per_hour=1.01 "
            "(no spot saving is proposed)",
            f"GPU catalog {cat} line 2, achievable_fp16_tflops=130: above "
            "theoretical_fp16_tflops=100 (RFU is judged by it)",
            f"GPU catalog {cat} line 2, idle_power_w=300: at or above max_power_w=300 (an idle "
            "GPU draws less than its max)",
        ]
        assert load_prices(prices)["spot_usd_per_hour"].to_list() == [1.5]


def test_the_shipped_files_pass_every_check():
    from gpu_pipeline.lib.reference import check_files, load_energy

    assert check_files() == []
    assert load_energy().height >= 1


def test_by_model_gives_each_row_its_models_values_as_a_per_row_join_would():
    """`by_model` works the key out once per model name; each row gets what joining on its
    own key gives: spellings of one model alike, an unknown or missing model null."""
    from gpu_pipeline.lib.reference import by_model

    prices = load_prices().lazy().select("model_key", pl.col("spot_usd_per_hour").alias("_spot"))
    names = [
        "NVIDIA A100-SXM4-80GB",
        "a100 sxm4 80gb",
        None,
        "Mystery GPU",
        "NVIDIA H100 80GB HBM3",
    ]
    rows = pl.LazyFrame({"i": range(len(names) * 3), "gpu_model": names * 3})
    got = by_model(rows, prices).collect()
    want = (
        rows.with_columns(model_key(pl.col("gpu_model")).alias("model_key"))
        .join(prices, on="model_key", how="left", maintain_order="left")
        .drop("model_key")
        .collect()
    )
    assert got.equals(want)
    spot = dict(zip(got["gpu_model"].to_list()[:5], got["_spot"].to_list()[:5], strict=True))
    assert spot["NVIDIA A100-SXM4-80GB"] == spot["a100 sxm4 80gb"] is not None
    assert spot[None] is None and spot["Mystery GPU"] is None
