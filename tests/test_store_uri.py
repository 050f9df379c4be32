"""A lake or landing zone on an object store is `s3://bucket/prefix` and nothing more: a URI with
credentials (user info) or options (?query) is refused in one line that does not show the
secret, before anything runs (settings `_folder`); credentials come from the environment."""

import pytest

from gpu_pipeline import cli, settings

SECRET = "SeCrEtInUri"


@pytest.mark.parametrize("flag", ["--lake", "--raw"])
@pytest.mark.parametrize(
    "uri, why",
    [
        (f"s3://test:{SECRET}@lake1/pg3", "holds credentials"),
        (f"s3://AKIAEXAMPLE:{SECRET}/with/slash@lake1/pg3", "holds credentials"),
        ("s3://lake1/pg4?endpoint_override=127.0.0.1:45123&scheme=http", "holds ?options"),
        (f"s3://lake1/pg4?secret_key={SECRET}", "holds ?options"),
        (f"s3://lake1/pg4#{SECRET}", "#fragment"),
    ],
)
def test_a_store_uri_with_credentials_or_options_is_refused(
    flag, uri, why, capsys, monkeypatch, tmp_path
):
    """`materialize` with such a URI exits 2 with one error line naming the flag and saying
    credentials come from the environment, the secret nowhere in what it printed."""
    import os

    for k in [k for k in os.environ if k.startswith("GPU_PIPELINE_")]:
        monkeypatch.delenv(k)
    # a Dagster instance and data/ of the test's own, and no store to reach (without the check
    # the run would start)
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dh"))
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.chdir(tmp_path)
    code = cli.main(["materialize", "--start", "2024-01-01", flag, uri])
    out = capsys.readouterr()
    printed = out.out + out.err
    assert code == 2, printed
    lines = [line for line in printed.splitlines() if line.strip()]
    assert len(lines) == 1, printed
    assert lines[0].startswith(f"error: {flag} 's3://") and why in lines[0]
    assert "credentials, endpoint and region come from environment variables" in lines[0]
    assert "AWS_SECRET_ACCESS_KEY" in lines[0] and "<hidden>" in lines[0]
    assert SECRET not in printed and "endpoint_override" not in printed


@pytest.mark.parametrize("var", ["GPU_PIPELINE_LAKE", "GPU_PIPELINE_RAW", "GPU_PIPELINE_CACHE"])
def test_a_variable_holding_credentials_is_refused_without_showing_them(var):
    with pytest.raises(settings.SettingsError) as e:
        settings.Settings.from_env({var: f"s3://AKIAEXAMPLE:{SECRET}@lake1/prefix"})
    assert e.value.lines == [e.value.lines[0]] and e.value.lines[0].startswith(f"{var}='s3://")
    assert SECRET not in str(e.value) and "AKIAEXAMPLE" not in str(e.value)


@pytest.mark.parametrize(
    "uri, why",
    [("s3://lake1:9000/p", "or a port"), ("s3:///prefix", "names no bucket")],
)
def test_a_store_uri_without_a_plain_bucket_is_refused(uri, why):
    with pytest.raises(settings.SettingsError, match=why):
        settings.parse("GPU_PIPELINE_LAKE", uri, name="--lake")


@pytest.mark.parametrize("uri", ["s3://lake1/pg3", "s3://lake1", "s3://lake1/team@x/lake"])
def test_a_plain_store_uri_is_accepted(uri):
    assert settings.parse("GPU_PIPELINE_LAKE", uri, name="--lake") == uri
    assert settings.parse("GPU_PIPELINE_RAW", uri, name="--raw") == uri
