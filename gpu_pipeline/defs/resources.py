"""Resources: the lake, the landing zone, the reference data and the Prometheus server.

They hold every setting (`settings.Settings`, bound to `GPU_PIPELINE_*` variables as
`dg.EnvVar`s by `definitions.build_definitions`); assets pass the values on to `lib/`.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import contextmanager
from datetime import date, timedelta
from typing import TYPE_CHECKING, TypeVar

import dagster as dg
import polars as pl
import pydantic

from gpu_pipeline.lib.ingest.landing import ParseOptions
from gpu_pipeline.lib.ingest.pull import PromServer
from gpu_pipeline.lib.io.lake import Lake
from gpu_pipeline.lib.reference import load_catalog, load_energy, load_prices
from gpu_pipeline.lib.rules import Rules, load_rules
from gpu_pipeline.lib.staging.chunked import DEFAULT_CHUNK_MB, Chunking
from gpu_pipeline.settings import Settings

if TYPE_CHECKING:
    from gpu_pipeline.lib.io.report import InForce

R = TypeVar("R", bound=dg.ConfigurableResource)


def described(cls: type[R], descriptions: Mapping[str, str]) -> type[R]:
    """`cls` whose config fields carry `descriptions`: what the UI's resource page shows under
    each field's name (the variable that sets it, its default, the value in force). A subclass
    made for one set of definitions, so that the text can name values the class cannot know;
    same name, same fields, same defaults."""
    fields = cls.model_fields
    namespace: dict = {
        "__module__": cls.__module__,
        "__qualname__": cls.__qualname__,
        "__doc__": cls.__doc__,
        "__annotations__": {name: fields[name].annotation for name in descriptions},
    }
    for name, text in descriptions.items():
        f = fields[name]
        namespace[name] = (
            pydantic.Field(description=text)
            if f.is_required()
            else pydantic.Field(default=f.default, description=text)
        )
    return type(cls.__name__, (cls,), namespace)


def run_days(tags: dict[str, str]) -> list[date]:
    """The UTC days a run's partition tags name (a partition, or a range of them); none for a
    run of months (`2024-01`: the month's asset takes its days' locks itself, around its read
    and write, `monthly.write_month`)."""
    if "dagster/partition" in tags:
        try:
            return [date.fromisoformat(tags["dagster/partition"])]
        except ValueError:
            return []
    start = tags.get("dagster/asset_partition_range_start")
    end = tags.get("dagster/asset_partition_range_end")
    try:
        first, last = date.fromisoformat(start or ""), date.fromisoformat(end or "")
    except ValueError:
        return []
    return [first + timedelta(days=i) for i in range((last - first).days + 1)]


class LakeResource(dg.ConfigurableResource):
    """Root of the Parquet lake (`<root>/<table>/date=YYYY-MM-DD/data.parquet`), where parsed
    landing files are cached (`cache`, "": beside the lake) and how a day is cut into chunks of
    GPUs (`chunk_mb` memory budget, or `chunk_gpus` GPUs; `split` by GPU count or cluster).

    For the length of a run it holds the lake's lock on each day the run writes, so two runs
    of one day run one after the other and the lake never holds one run's ingest_log beside the
    other's marts. (With GPU_PIPELINE_EXECUTOR=multiprocess the lock is held per step.)
    """

    root: str
    cache: str = ""
    chunk_mb: int = DEFAULT_CHUNK_MB
    chunk_gpus: int = 0
    split: str = "gpus"

    def open(self) -> Lake:
        return Lake(self.root, self.cache or None)

    def chunking(self) -> Chunking:
        return Chunking(mb=self.chunk_mb, gpus=self.chunk_gpus or None, split=self.split)

    @contextmanager
    def yield_for_execution(self, context: dg.InitResourceContext):
        days = run_days(dict(context.dagster_run.tags)) if context.dagster_run else []
        if not days:
            yield self
            return

        def waiting(day: date) -> None:
            # said as a day's line ("D: …"), which the CLI's progress shows without --verbose
            context.log.info(
                f"{day}: waiting for another run writing this day in {self.root} to finish "
                "(one writer per day)"
            )

        with self.open().day_locks(days, waiting):
            yield self


class LandingResource(dg.ConfigurableResource):
    """Folder where raw telemetry exports land, and how they are read: the zone of zone-less CSV
    times, the largest file read (MiB; larger ones are quarantined whole)."""

    root: str
    csv_timezone: str = Settings.csv_timezone
    max_file_mb: int = Settings.max_file_mb

    def parse_options(self) -> ParseOptions:
        return ParseOptions(csv_timezone=self.csv_timezone, max_file_bytes=self.max_file_mb * 2**20)


class ReferenceResource(dg.ConfigurableResource):
    """GPU catalog, price book, rules (thresholds) and energy rates; empty paths mean the shipped
    defaults.

    `rules`: a TOML rules file (GPU_PIPELINE_RULES); `rule_overrides`: `section.key` -> value
    from run config, over the file (e.g. {"health.hot_from_c": 85}). `catalog` extends the
    shipped GPU catalog (GPU_PIPELINE_CATALOG).
    """

    prices: str = ""
    catalog: str = ""
    rules: str = ""
    rule_overrides: dict[str, float] = {}
    energy: str = ""

    def load_energy(self) -> pl.DataFrame:
        """Electricity $/kWh and gCO2/kWh per cluster (GPU_PIPELINE_ENERGY)."""
        return load_energy(self.energy or None)

    def load_rules(self) -> Rules:
        return load_rules(self.rules or None, dict(self.rule_overrides) or None)

    def load_catalog(self) -> pl.DataFrame:
        return load_catalog(self.catalog or None)

    def load_prices(self) -> pl.DataFrame:
        return load_prices(self.prices or None)

    def in_force(self) -> InForce:
        """What a day's dollars and thresholds come from, as its report's appendix names them
        (the daily_report asset and `gpu-pipeline report` alike)."""
        from gpu_pipeline.lib.io.report import InForce

        return InForce(
            prices=self.prices or None,
            energy=self.energy or None,
            rules=self.load_rules(),
            rules_file=self.rules or None,
        )


class PromResource(dg.ConfigurableResource):
    """A Prometheus-compatible server (Prometheus, Thanos, Mimir, VictoriaMetrics) to pull from.

    Bound to GPU_PIPELINE_PROM_* environment variables; credentials stay in the environment
    (Dagster shows an EnvVar's name, never its value).
    """

    url: str
    # the pull's own defaults (lib/ingest/pull.py), one place for them
    token: str = PromServer.token
    username: str = PromServer.username
    password: str = PromServer.password
    ca_bundle: str = PromServer.ca_bundle
    verify: bool = PromServer.verify
    selector: str = PromServer.selector
    mode: str = PromServer.mode
    step_s: int = PromServer.step_s
    window_s: int = PromServer.window_s
    concurrency: int = PromServer.concurrency
    max_response_mb: int = int(PromServer.max_response_mb)  # the largest answer read (MiB)
    request_timeout_s: int = int(PromServer.request_timeout_s)  # a whole request
    cluster: str = PromServer.cluster

    def server(self) -> PromServer:
        return PromServer(
            url=self.url,
            token=self.token,
            username=self.username,
            password=self.password,
            ca_bundle=self.ca_bundle,
            verify=self.verify,
            selector=self.selector,
            mode=self.mode,
            step_s=self.step_s,
            window_s=self.window_s,
            concurrency=self.concurrency,
            max_response_mb=self.max_response_mb,
            request_timeout_s=self.request_timeout_s,
            cluster=self.cluster,
        )
