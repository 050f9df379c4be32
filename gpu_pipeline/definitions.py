"""Dagster entry point (`workspace.yaml` loads this module)."""

from gpu_pipeline.settings import Settings, SettingsError

# Every GPU_PIPELINE_* variable is checked before anything reads one: a value that is not
# allowed fails the code location's load (`dagster dev`, `dg dev`, `dg check defs`, a run's own
# process) with one line per variable, naming it, its value and what is allowed, raised here so
# that the error's stack is this one line and not the import chain of the first module to read it
try:
    Settings.from_env()
except SettingsError as e:
    raise SettingsError(e.lines) from None

from pathlib import Path

import dagster as dg

from gpu_pipeline.defs import marts, monthly, notify, report, staging, warehouse
from gpu_pipeline.defs.jobs import build_jobs
from gpu_pipeline.defs.orphans import orphaned_runs_sensor
from gpu_pipeline.defs.partitions import DEFAULT as DEFAULT_PARTITIONING
from gpu_pipeline.defs.partitions import Partitioning
from gpu_pipeline.defs.pull import prometheus_export
from gpu_pipeline.defs.raw import build_ingest, ingest
from gpu_pipeline.defs.resources import (
    LakeResource,
    LandingResource,
    PromResource,
    ReferenceResource,
    described,
)
from gpu_pipeline.defs.sensors import (
    build_freshness_checks,
    build_freshness_sensor,
    build_landing_sensor,
    landing_files,
)
from gpu_pipeline.settings import (
    CHECKS,
    DEFAULT_LAKE,
    ENV_VARS,
    PROM_SETTINGS,
    _no_password,
    url_origin,
)

EXECUTORS = ("in_process", "multiprocess", "k8s")
# what persistent_bottlenecks reads over its window of days (the rules' `window_days`)
PERSISTENCE_INPUT = dg.AssetKey("gpu_daily")


def executor(kind: str) -> dg.ExecutorDefinition:
    """Where a run's steps execute (GPU_PIPELINE_EXECUTOR).

    `in_process` (default): every step in the run's own process. A day's steps are small next to
    the cost of starting a Python process with Polars and Dagster (~2-4 s a step, ~25 s a run on
    2 cores), and Polars already uses every core inside a step. `multiprocess`: each step in its
    own process, two at a time. `k8s`: each step in its own pod (`deploy/k8s/run_config.yaml`).
    """
    if kind not in EXECUTORS:
        raise ValueError(
            f"GPU_PIPELINE_EXECUTOR must be one of {', '.join(EXECUTORS)}, not {kind!r}"
        )
    if kind == "multiprocess":
        return dg.multiprocess_executor.configured({"max_concurrent": 2})
    if kind == "k8s":
        from dagster_k8s import k8s_job_executor

        return k8s_job_executor
    return dg.in_process_executor


def _bind(s: Settings, name: str) -> object:
    """A setting for a resource: `dg.EnvVar` when its variable set it (the UI shows the variable,
    and a run resolves it in its own process), else the value itself."""
    value = getattr(s, name)
    if name not in s.from_env_fields:
        return value
    var = ENV_VARS[name]
    return dg.EnvVar.int(var) if isinstance(value, int) else dg.EnvVar(var)


# what each setting's default is, as the UI's resource page says it beside the variable
DEFAULTS = {
    "raw": "data/raw",
    "lake": DEFAULT_LAKE,
    "cache": "beside the lake",
    "prices": "the shipped price book",
    "catalog": "the shipped GPU catalog alone",
    "energy": "the shipped energy rates",
    "rules": "the built-in rules",
    "chunk_mb": str(Settings.chunk_mb),
    "chunk_gpus": "0: chunks follow chunk_mb",
    "split": "gpus",
    "csv_timezone": "UTC",
    "max_file_mb": str(Settings.max_file_mb),
}


def in_force(s: Settings, name: str) -> str:
    """The value of setting `name` a run uses, resolved: paths absolute, an empty path the
    shipped file it stands for."""
    from gpu_pipeline.lib.reference import DEFAULT_CATALOG, DEFAULT_ENERGY, DEFAULT_PRICES

    value = getattr(s, name)
    if name in ("raw", "lake", "cache", "prices", "catalog", "energy", "rules") and value:
        path = value if "://" in value else str(Path(value).resolve())
        return f"{path}, over the shipped catalog" if name == "catalog" else path
    shipped = {"prices": DEFAULT_PRICES, "energy": DEFAULT_ENERGY, "catalog": DEFAULT_CATALOG}
    if name in shipped:
        return f"shipped: {shipped[name]}"
    if name == "cache":  # as Lake.cache_dir has it (not made here: it may reach an object store)
        if "://" in s.lake:
            return "a folder under data/cache named by the lake's URI"
        return str(Path(s.lake).resolve() / "_ingest_cache")
    if name == "rules":
        return "built-in (every rule: config/rules.example.toml)"
    return str(value)


def describe(s: Settings, fields: dict[str, str]) -> dict[str, str]:
    """A resource's field -> what the UI shows under it: the variable that sets it, its default
    and the value in force (a field bound to an EnvVar shows the variable's name as its value,
    never what it resolved to)."""
    return {
        field: f"{ENV_VARS[name]} (default: {DEFAULTS[name]}). In force: {in_force(s, name)}"
        for field, name in fields.items()
    }


def describe_prom(s: Settings) -> dict[str, str]:
    """The pull's fields: variable, default and value in force (secrets: whether set)."""
    out = {}
    for name, (var, _) in PROM_SETTINGS.items():
        default = PromResource.model_fields[name].default
        if name not in s.prom:
            value = "unset" if default in ("", None) else str(default)
        elif CHECKS[var].secret:
            value = "set (never shown)"
        else:
            value = _no_password(str(s.prom[name])) if name == "url" else str(s.prom[name])
        shown = "" if default in ("", None) else f" (default: {default})"
        out[name] = f"{var}{shown}. In force: {value}"
    return out


def notifier(s: Settings) -> notify.NotifyResource:
    """The digest's webhook and the reports' base URL, bound to their variables (the UI's
    resource page shows the webhook by scheme and host only: its path is its secret)."""
    url, base = ENV_VARS["notify_url"], ENV_VARS["report_base_url"]
    shown = url_origin(s.notify_url) if s.notify_url else "unset: no digest"
    return described(
        notify.NotifyResource,
        {
            "url": f"{url} (default: unset, no digest). In force: {shown}",
            "report_base_url": f"{base} (default: unset, the digest links the report's path "
            f"in the lake). In force: {s.report_base_url or 'unset'}",
        },
    )(url=_bind(s, "notify_url"), report_base_url=_bind(s, "report_base_url"))


def prometheus(s: Settings, enabled: bool | None = None) -> dict:
    """The pull's resource bound to the GPU_PIPELINE_PROM_* variables that are set (the URL may
    come from a CLI flag), or {} when no server is configured (then the graph reads files only)."""
    if enabled is False or not s.prom_url:
        return {}
    bound = {
        name: (
            value
            if f"prom.{name}" not in s.from_env_fields or kind is bool
            else dg.EnvVar.int(var)
            if kind is int
            else dg.EnvVar(var)
        )
        for name, value in s.prom.items()
        for var, kind in [PROM_SETTINGS[name]]
    }
    return {"prometheus": described(PromResource, describe_prom(s))(**bound)}


def partitioned(a: dg.AssetsDefinition, p: Partitioning) -> dg.AssetsDefinition:
    """`a` on partitioning `p`: its days, its window over the days before and its backfill
    policy (the modules build their assets on the default partitioning; settings enter here,
    not at import)."""
    if a.partitions_def is None or p == DEFAULT_PARTITIONING:
        return a
    if a.backfill_policy != p.backfill_policy:
        a = a.with_attributes(backfill_policy=p.backfill_policy)
    if isinstance(a.partitions_def, dg.MonthlyPartitionsDefinition):  # its days: any mapping
        return a.map_asset_specs(lambda s: s.replace_attributes(partitions_def=p.monthly))

    def spec(s: dg.AssetSpec) -> dg.AssetSpec:
        deps = [
            dg.AssetDep(d.asset_key, partition_mapping=p.window)
            # the persistence window follows the rules; the report's trend is 7 days whatever
            if d.asset_key == PERSISTENCE_INPUT
            and isinstance(d.partition_mapping, dg.TimeWindowPartitionMapping)
            else d
            for d in s.deps
        ]
        return s.replace_attributes(partitions_def=p.daily, deps=deps)

    return a.map_asset_specs(spec)


def build_definitions(s: Settings | None = None, pull: bool | None = None) -> dg.Definitions:
    """Definitions bound to `s` (default: this process's GPU_PIPELINE_* variables): its days,
    window, sensor interval and resources. `pull=False` leaves the Prometheus pull out even
    when a server is configured."""
    s = s or Settings.from_env()
    p = Partitioning.of(s)
    prom = prometheus(s, pull)
    assets = dg.load_assets_from_modules([staging, marts, monthly, report, notify, warehouse])
    if prom:  # the pull lands files before the ingest reads them
        assets += [prometheus_export, build_ingest(("prometheus_export",))]
    else:
        assets += [ingest]
    freshness = build_freshness_checks(p)
    job, schedule = build_jobs(p, freshness)
    return dg.Definitions(
        assets=[landing_files, *[partitioned(a, p) for a in assets]],
        asset_checks=[freshness],
        jobs=[job, monthly.build_monthly_job(p), warehouse.refresh_warehouse],
        schedules=[schedule],
        sensors=[
            build_landing_sensor(p),
            build_freshness_sensor(freshness),
            monthly.monthly_automation_sensor,
            orphaned_runs_sensor,
        ],
        # the run queue in config/dagster.yaml limits how many runs a backfill has going at once
        executor=executor(s.executor),
        resources={
            "lake": described(
                LakeResource,
                describe(
                    s,
                    {
                        "root": "lake",
                        "cache": "cache",
                        "chunk_mb": "chunk_mb",
                        "chunk_gpus": "chunk_gpus",
                        "split": "split",
                    },
                ),
            )(
                root=_bind(s, "lake"),
                cache=_bind(s, "cache"),
                chunk_mb=_bind(s, "chunk_mb"),
                chunk_gpus=_bind(s, "chunk_gpus"),
                split=_bind(s, "split"),
            ),
            "landing": described(
                LandingResource,
                describe(
                    s, {"root": "raw", "csv_timezone": "csv_timezone", "max_file_mb": "max_file_mb"}
                ),
            )(
                root=_bind(s, "raw"),
                csv_timezone=_bind(s, "csv_timezone"),
                max_file_mb=_bind(s, "max_file_mb"),
            ),
            "reference": described(
                ReferenceResource,
                describe(
                    s,
                    {
                        "prices": "prices",
                        "catalog": "catalog",
                        "rules": "rules",
                        "energy": "energy",
                    },
                )
                | {"rule_overrides": "Run config only: section.key -> value over the rules file"},
            )(
                prices=_bind(s, "prices"),
                catalog=_bind(s, "catalog"),
                rules=_bind(s, "rules"),
                energy=_bind(s, "energy"),
            ),
            "notify": notifier(s),
            **prom,
        },
    )


def cli_job(flags: str, pull: bool | None) -> dg.JobDefinition:
    """`daily_pipeline` as `gpu-pipeline materialize` builds it, for GPU_PIPELINE_EXECUTOR=
    multiprocess (`dg.build_reconstructable_job`, runs.py `_launch`): rebuilt in every step's
    process from that process's environment (the CLI's own) with the CLI's flags over it
    (`flags`: JSON, setting name -> value)."""
    import json

    s = Settings.from_env().replace(**json.loads(flags))
    return build_definitions(s, pull=pull).resolve_job_def("daily_pipeline")


defs = build_definitions()
