"""The Kubernetes configuration in deploy/k8s loads against dagster-k8s's own schemas."""

from pathlib import Path

import pytest
import yaml

dagster_k8s = pytest.importorskip("dagster_k8s")

from dagster._config import process_config  # noqa: E402

DEPLOY = Path(__file__).resolve().parents[1] / "deploy" / "k8s"


def test_run_launcher_config_is_valid():
    cfg = yaml.safe_load((DEPLOY / "dagster.yaml").read_text())
    launcher = cfg["run_launcher"]
    assert (launcher["module"], launcher["class"]) == ("dagster_k8s", "K8sRunLauncher")
    result = process_config(dagster_k8s.K8sRunLauncher.config_type(), launcher["config"])
    assert result.success, result.errors
    assert cfg["run_coordinator"]["config"]["max_concurrent_runs"] == 8


def test_k8s_executor_run_config_is_valid():
    cfg = yaml.safe_load((DEPLOY / "run_config.yaml").read_text())
    schema = dagster_k8s.k8s_job_executor.config_schema.config_type
    result = process_config(schema, cfg["execution"]["config"])
    assert result.success, result.errors


def test_a_broken_config_is_caught():
    result = process_config(
        dagster_k8s.K8sRunLauncher.config_type(), {"job_image": 7, "no_such_key": True}
    )
    assert not result.success
