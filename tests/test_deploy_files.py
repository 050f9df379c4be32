"""The deployment files agree with each other, with the Dagster Helm chart and with the code.

No cluster, Helm or Docker daemon is needed: the files are parsed and compared (Dockerfile,
.dockerignore, deploy/helm/values.yaml, deploy/k8s/*.yaml, the Makefile, pyproject.toml,
gpu_pipeline.settings). What is not checked here is listed in docs/deploy.md.
"""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from pathlib import Path

import pytest
import yaml

from gpu_pipeline import settings

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
VALUES = DEPLOY / "helm" / "values.yaml"

# Key paths of the official chart's values (`dagster/dagster`, helm/dagster/values.yaml) that
# deploy/helm/values.yaml uses, copied from the chart's values.yaml as vendored in
# github.com/unicef/magasin at commit 5e110fde751fc231e06ef1844d38cc434bcaca43 (the stored copies
# of dagster-io/dagster's own file here were older than the webserver rename). `[]` is an item
# of a list. `codeServerArgs` is named in that file's comment on dagsterApiGrpcArgs ("can also be
# replaced with `codeServerArgs`"), used by the subchart's templates/deployment-user.yaml and
# declared by the chart's schema (UserDeployment.codeServerArgs).
CHART_KEYS = frozenset(
    {
        "global.serviceAccountName",
        "global.postgresqlSecretName",
        "global.dagsterHome",
        "rbacEnabled",
        "serviceAccount.create",
        "dagster-user-deployments.enabled",
        "dagster-user-deployments.enableSubchart",
        "dagster-user-deployments.deployments",
        "dagster-user-deployments.deployments[].name",
        "dagster-user-deployments.deployments[].image.repository",
        "dagster-user-deployments.deployments[].image.tag",
        "dagster-user-deployments.deployments[].image.pullPolicy",
        "dagster-user-deployments.deployments[].dagsterApiGrpcArgs",
        "dagster-user-deployments.deployments[].codeServerArgs",
        "dagster-user-deployments.deployments[].port",
        "dagster-user-deployments.deployments[].includeConfigInLaunchedRuns.enabled",
        "dagster-user-deployments.deployments[].envConfigMaps",
        "dagster-user-deployments.deployments[].envSecrets",
        "dagster-user-deployments.deployments[].resources",
        "dagsterWebserver.resources",
        "dagsterDaemon.resources",
        "dagsterDaemon.runCoordinator.enabled",
        "dagsterDaemon.runCoordinator.type",
        "dagsterDaemon.runCoordinator.config.queuedRunCoordinator.maxConcurrentRuns",
        "dagsterDaemon.runCoordinator.config.queuedRunCoordinator.tagConcurrencyLimits",
        "runLauncher.type",
        "runLauncher.config.k8sRunLauncher.imagePullPolicy",
        "runLauncher.config.k8sRunLauncher.jobNamespace",
        "runLauncher.config.k8sRunLauncher.envConfigMaps",
        "runLauncher.config.k8sRunLauncher.envSecrets",
        "runLauncher.config.k8sRunLauncher.resources",
        "postgresql.enabled",
        "postgresql.postgresqlHost",
        "postgresql.postgresqlUsername",
        "postgresql.postgresqlDatabase",
        "postgresql.postgresqlScheme",
        "postgresql.service.port",
        "generatePostgresqlPasswordSecret",
        "telemetry.enabled",
    }
)
# keys whose contents are Kubernetes objects or lists the chart passes through (`toYaml`)
FREE_FORM = frozenset(
    {
        "dagster-user-deployments.deployments[].codeServerArgs",
        "dagster-user-deployments.deployments[].dagsterApiGrpcArgs",
        "dagster-user-deployments.deployments[].envConfigMaps",
        "dagster-user-deployments.deployments[].envSecrets",
        "dagster-user-deployments.deployments[].resources",
        "dagsterWebserver.resources",
        "dagsterDaemon.resources",
        "dagsterDaemon.runCoordinator.config.queuedRunCoordinator.tagConcurrencyLimits",
        "runLauncher.config.k8sRunLauncher.envConfigMaps",
        "runLauncher.config.k8sRunLauncher.envSecrets",
        "runLauncher.config.k8sRunLauncher.resources",
    }
)


def key_paths(node: object, prefix: str = "") -> list[str]:
    """The leaf key paths of a values tree, down to the free-form keys (list items: `[]`)."""
    if prefix in FREE_FORM or not isinstance(node, dict | list):
        return [prefix]
    if isinstance(node, list):
        return [p for item in node for p in key_paths(item, f"{prefix}[]")]
    paths = []
    for key, value in node.items():
        paths += key_paths(value, f"{prefix}.{key}" if prefix else str(key))
    return paths


def not_in_chart(values: dict) -> list[str]:
    return [p for p in key_paths(values) if p not in CHART_KEYS]


def load_all(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def values() -> dict:
    return yaml.safe_load(VALUES.read_text())


def instance() -> dict:
    return yaml.safe_load((DEPLOY / "k8s" / "dagster.yaml").read_text())


def manifests() -> dict[tuple[str, str], dict]:
    """The Kubernetes objects of deploy/k8s (not the Dagster configs), by (kind, name)."""
    out = {}
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        for doc in load_all(path):
            if "kind" in doc:
                out[(doc["kind"], doc["metadata"]["name"])] = doc
    return out


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined, comments dropped."""
    lines, current = [], ""
    for raw in (ROOT / "Dockerfile").read_text().splitlines():
        line = raw.strip()
        if not current and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):  # a comment inside a continued instruction
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        lines.append(current + line)
        current = ""
    # one space between words (continuation lines leave runs of them)
    return [(ln.split(None, 1)[0].upper(), " ".join(ln.split()[1:])) for ln in lines]


def instructions(name: str) -> list[str]:
    return [args for instr, args in dockerfile() if instr == name]


def runtime_stage() -> list[tuple[str, str]]:
    steps = dockerfile()
    last_from = max(i for i, (instr, _) in enumerate(steps) if instr == "FROM")
    return steps[last_from:]


def makefile_var(name: str) -> str:
    m = re.search(rf"^{name}\s*\??:?=\s*(.+)$", (ROOT / "Makefile").read_text(), re.M)
    assert m, f"{name} not in the Makefile"
    return m.group(1).strip()


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def bytes_of(quantity: str) -> int:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti)?", str(quantity))
    assert m, quantity
    return int(float(m.group(1)) * units.get(m.group(2) or "", 1))


def the_deployment() -> dict:
    (deployment,) = values()["dagster-user-deployments"]["deployments"]
    return deployment


# --- every file parses -------------------------------------------------------------------------


def test_every_yaml_under_deploy_parses():
    paths = sorted(DEPLOY.rglob("*.yaml"))
    names = {p.relative_to(DEPLOY).as_posix() for p in paths}
    assert {"helm/values.yaml", "k8s/rbac.yaml", "k8s/secret.example.yaml", "k8s/dagster.yaml"} <= (
        names
    )
    for path in paths:
        docs = load_all(path)
        assert docs, path
        assert all(isinstance(d, dict) for d in docs), path


# --- values.yaml against the chart ---------------------------------------------------------------


def test_values_use_only_the_charts_keys():
    assert not_in_chart(values()) == []
    assert FREE_FORM <= CHART_KEYS


def test_a_key_the_chart_does_not_have_is_caught():
    broken = values()
    broken["dagsterDaemon"]["runCoordinator"]["config"]["queuedRunCoordinator"][
        "maxConcurentRuns"
    ] = 8
    broken["runLauncher"]["config"]["k8sRunLauncher"]["serviceAccount"] = "x"
    assert not_in_chart(broken) == [
        "dagsterDaemon.runCoordinator.config.queuedRunCoordinator.maxConcurentRuns",
        "runLauncher.config.k8sRunLauncher.serviceAccount",
    ]


# --- the image, its command and port -----------------------------------------------------------


def test_values_image_command_and_port_are_the_dockerfiles():
    (expose,) = instructions("EXPOSE")
    (cmd,) = instructions("CMD")
    cmd = json.loads(cmd)
    deployment = the_deployment()
    port = deployment["port"]
    assert expose == str(port) == "3030"
    # the chart runs `dagster code-server start -h 0.0.0.0 -p <port> <codeServerArgs>`
    assert (
        cmd
        == ["dagster", "code-server", "start", "-h", "0.0.0.0", "-p", str(port)]
        + (deployment["codeServerArgs"])
    )
    # no ENTRYPOINT: the chart and the run launcher set the container's args, which must run alone
    assert instructions("ENTRYPOINT") == []
    module = deployment["codeServerArgs"][deployment["codeServerArgs"].index("-m") + 1]
    assert module == pyproject()["tool"]["dagster"]["module_name"] == "gpu_pipeline.definitions"
    # the same image as the instance config for an install without the chart, tagged with the version
    job_image = instance()["run_launcher"]["config"]["job_image"]
    assert deployment["image"]["repository"] == job_image.rsplit(":", 1)[0]
    assert deployment["image"]["tag"] == pyproject()["project"]["version"]
    env = " ".join(instructions("ENV"))
    assert f"DAGSTER_HOME={values()['global']['dagsterHome']}" in env


def test_the_code_servers_module_holds_the_definitions():
    import importlib

    import dagster as dg

    module = importlib.import_module(the_deployment()["codeServerArgs"][1])
    assert isinstance(module.defs, dg.Definitions)


# --- the Dockerfile builds the tokenizer as the Makefile does, and runs as non-root -------------


def test_dockerfile_builds_the_native_tokenizer_with_the_makefiles_flags():
    flags = makefile_var("NATIVE_CFLAGS")
    native = makefile_var("NATIVE")
    assert flags == "-O2 -Wall -Wextra -shared -fPIC -pthread"
    (arg,) = [a for a in instructions("ARG") if a.startswith("NATIVE_CFLAGS=")]
    assert shlex.split(arg.split("=", 1)[1]) == [flags]
    # the Makefile's rule: $(CC) $(NATIVE_CFLAGS) -o $@ $<
    compile_steps = [r for r in instructions("RUN") if r.startswith("cc ")]
    assert compile_steps == [f"cc ${{NATIVE_CFLAGS}} -o {native} gpu_pipeline/native/exposition.c"]
    # the runtime stage gets that .so beside gpu_pipeline/native/__init__.py in the venv
    copies = [a for i, a in runtime_stage() if i == "COPY" and native in a]
    assert copies == [
        f"--from=builder /src/{native} /opt/venv/lib/python3.11/site-packages/{native}"
    ]
    assert any("n.available()" in a for i, a in runtime_stage() if i == "RUN")


def test_dockerfile_installs_the_cluster_extra_into_a_venv():
    froms = instructions("FROM")
    assert froms == ["python:3.11-slim-bookworm AS builder", "python:3.11-slim-bookworm"]
    runs = " ".join(instructions("RUN"))
    assert "python -m venv /opt/venv" in runs
    assert "/opt/venv/bin/pip install --no-cache-dir '.[cluster]'" in runs
    assert any(a.startswith("--from=builder /opt/venv /opt/venv") for a in instructions("COPY"))


def test_the_image_runs_as_a_non_root_user():
    users = [a for i, a in runtime_stage() if i == "USER"]
    assert users == ["10001:10001"]
    steps = runtime_stage()
    user_at = steps.index(("USER", "10001:10001"))
    # nothing after USER needs root, and CMD comes after it
    assert [i for i, _ in steps[user_at:]] == ["USER", "WORKDIR", "EXPOSE", "CMD"]
    assert "useradd --uid 10001" in " ".join(a for i, a in steps if i == "RUN")


def test_dockerignore_keeps_local_state_out_of_the_context():
    ignored = {
        ln.strip()
        for ln in (ROOT / ".dockerignore").read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    }
    assert {".git", ".venv", "data", "benchmarks/out", "gpu_pipeline/native/*.so"} <= ignored
    assert {"**/__pycache__", ".pytest_cache", ".ruff_cache"} <= ignored


# --- the ServiceAccount and its rights ----------------------------------------------------------


def covers(rules: list[dict], group: str, resource: str, verb: str) -> bool:
    return any(
        group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"] for r in rules
    )


def test_the_service_account_is_the_run_launchers():
    objs = manifests()
    launcher = instance()["run_launcher"]["config"]
    name, namespace = launcher["service_account_name"], launcher["job_namespace"]
    assert ("ServiceAccount", name) in objs
    assert values()["global"]["serviceAccountName"] == name
    assert values()["serviceAccount"]["create"] is False
    assert values()["runLauncher"]["config"]["k8sRunLauncher"]["jobNamespace"] == namespace
    binding = objs[("RoleBinding", name)]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]
    role = objs[("Role", binding["roleRef"]["name"])]
    assert binding["roleRef"]["kind"] == "Role"
    for obj in (objs[("ServiceAccount", name)], role, binding):
        assert obj["metadata"]["namespace"] == namespace


def test_the_role_covers_what_the_run_launcher_and_step_executor_do():
    rules = manifests()[("Role", "gpu-pipeline")]["rules"]
    for verb in ("create", "get", "list", "watch", "delete"):
        assert covers(rules, "batch", "jobs", verb), verb
    assert covers(rules, "batch", "jobs/status", "get")
    for verb in ("get", "list", "watch", "delete"):
        assert covers(rules, "", "pods", verb), verb
    assert covers(rules, "", "pods/log", "get")
    assert covers(rules, "", "events", "list")
    # and no more than that: no writes to pods, nothing cluster-wide, no secrets
    assert not covers(rules, "", "pods", "create")
    assert not covers(rules, "", "secrets", "get")
    assert not any("*" in r["verbs"] or "*" in r["resources"] for r in rules)


# --- the example Secret and ConfigMap -----------------------------------------------------------


def test_the_configmap_holds_only_real_settings_with_allowed_values():
    objs = manifests()
    name = instance()["run_launcher"]["config"]["env_config_maps"][0]
    data = objs[("ConfigMap", name)]["data"]
    known = set(settings.ENV_VARS.values()) | {v for v, _ in settings.PROM_SETTINGS.values()}
    assert {"GPU_PIPELINE_LAKE", "GPU_PIPELINE_RAW"} <= set(data)
    assert sorted(k for k in data if k not in known) == []
    for var, text in data.items():
        if var == "GPU_PIPELINE_CACHE":  # checked for writability: the image's folder, not ours
            assert text.startswith(instructions("WORKDIR")[-1] + "/")
            continue
        settings.parse(var, text)  # a SettingsError if the value is not allowed
    # the same ConfigMap and Secret reach run pods and the code server
    secret = instance()["run_launcher"]["config"]["env_secrets"][0]
    launcher = values()["runLauncher"]["config"]["k8sRunLauncher"]
    for where in (launcher, the_deployment()):
        assert where["envConfigMaps"] == [{"name": name}]
        assert where["envSecrets"] == [{"name": secret}]


def test_a_setting_that_does_not_exist_would_be_caught():
    known = set(settings.ENV_VARS.values()) | {v for v, _ in settings.PROM_SETTINGS.values()}
    assert "GPU_PIPELINE_BUCKET" not in known
    with pytest.raises(settings.SettingsError):
        settings.parse("GPU_PIPELINE_EXECUTOR", "celery")


def test_the_example_secrets_hold_placeholders_only():
    objs = manifests()
    store = objs[("Secret", instance()["run_launcher"]["config"]["env_secrets"][0])]
    postgres = objs[("Secret", values()["global"]["postgresqlSecretName"])]
    assert store["stringData"]["AWS_ACCESS_KEY_ID"] == "REPLACE-ME"
    assert store["stringData"]["AWS_SECRET_ACCESS_KEY"] == "REPLACE-ME"
    # the chart reads this key of global.postgresqlSecretName, which it does not generate
    assert postgres["stringData"] == {"postgresql-password": "REPLACE-ME"}
    assert values()["generatePostgresqlPasswordSecret"] is False
    text = (DEPLOY / "k8s" / "secret.example.yaml").read_text()
    assert "never commit real" in text


# --- Postgres, the run queue and the pods' sizes -------------------------------------------------


def test_postgres_is_external_through_psycopg2():
    pg = values()["postgresql"]
    assert pg["enabled"] is False and pg["postgresqlHost"]
    assert pg["postgresqlScheme"] == "postgresql+psycopg2"


def test_the_run_queue_is_the_instances():
    queued = values()["dagsterDaemon"]["runCoordinator"]
    assert queued["type"] == "QueuedRunCoordinator" and queued["enabled"] is True
    config = queued["config"]["queuedRunCoordinator"]
    coordinator = instance()["run_coordinator"]["config"]
    assert config["maxConcurrentRuns"] == coordinator["max_concurrent_runs"] == 8
    (limit,) = config["tagConcurrencyLimits"]
    assert limit["key"] == "dagster/backfill" and limit["limit"] == 6
    assert limit["value"] == {"applyLimitPerUniqueValue": True}  # per backfill, not all of them


def test_run_pods_fit_the_measured_10000_gpu_day():
    launcher = values()["runLauncher"]
    assert launcher["type"] == "K8sRunLauncher"
    res = launcher["config"]["k8sRunLauncher"]["resources"]
    peak = 952 * 2**20  # the 10,000-GPU day's peak (benchmarks/README.md, issue 34)
    assert str(res["requests"]["cpu"]) == "2"  # the 2 cores it was measured on
    assert 2 * peak < bytes_of(res["requests"]["memory"]) <= bytes_of(res["limits"]["memory"])
    assert bytes_of(res["requests"]["memory"]) == 2 * 2**30
    assert bytes_of(res["limits"]["memory"]) == 3 * 2**30
    assert "cpu" not in res["limits"]
    # the same request as the instance config for an install without the chart
    requests = instance()["run_launcher"]["config"]["run_k8s_config"]["container_config"]
    assert bytes_of(requests["resources"]["requests"]["memory"]) == 2 * 2**30
    # the coordinating pods are small, and the code server's size does not reach run pods
    smaller = [
        values()["dagsterWebserver"]["resources"],
        values()["dagsterDaemon"]["resources"],
        the_deployment()["resources"],
    ]
    for r in smaller:
        assert bytes_of(r["limits"]["memory"]) <= 2**30
    assert the_deployment()["includeConfigInLaunchedRuns"] == {"enabled": False}
