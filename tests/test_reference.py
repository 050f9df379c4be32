"""GPU catalog and price book: SPEC values, model-name matching, overrides."""

import dagster as dg
import polars as pl
import pytest

from gpu_pipeline.definitions import build_definitions
from gpu_pipeline.lib.reference import ReferenceError, load_catalog, load_prices, model_key


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
    assert load_prices(prices).row(0, named=True)["on_demand_usd_per_hour"] == 9.99
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
