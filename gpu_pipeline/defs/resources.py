"""Resources: the lake, the landing zone and the reference data (catalog, price book)."""

from __future__ import annotations

import dagster as dg
import polars as pl

from gpu_pipeline.lib.lake import Lake
from gpu_pipeline.lib.reference import load_catalog, load_prices


class LakeResource(dg.ConfigurableResource):
    """Root of the Parquet lake (`<root>/<table>/date=YYYY-MM-DD/data.parquet`)."""

    root: str

    def lake(self) -> Lake:
        return Lake(self.root)


class LandingResource(dg.ConfigurableResource):
    """Folder where raw telemetry exports land."""

    root: str


class ReferenceResource(dg.ConfigurableResource):
    """GPU catalog and price book; empty paths mean the shipped defaults."""

    prices: str = ""
    catalog: str = ""

    def load_catalog(self) -> pl.DataFrame:
        return load_catalog(self.catalog or None)

    def load_prices(self) -> pl.DataFrame:
        return load_prices(self.prices or None)
