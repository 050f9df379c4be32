"""A failed run says why, whatever failed: a step, a resource that could not start (the S3 day
lock, an unreachable store: no step failure is recorded), or the run itself."""

import dagster as dg

from gpu_pipeline.runs import step_failures


class _Locked(dg.ConfigurableResource):
    def setup_for_execution(self, context) -> None:
        raise RuntimeError("cannot take the day lock: endpoint http://127.0.0.1:9 refused")


class _Fine(dg.ConfigurableResource):
    pass


@dg.asset
def needs_lock(lock: _Locked) -> int:
    return 1


@dg.asset
def fails(fine: _Fine) -> int:
    raise ValueError("the gpu_daily partition of 2024-01-01 is damaged")


def test_a_resource_that_cannot_start_is_the_runs_named_cause():
    res = dg.materialize([needs_lock], resources={"lock": _Locked()}, raise_on_error=False)
    assert not res.success
    assert step_failures(res.all_events) == [
        (
            "needs_lock",
            "RuntimeError: cannot take the day lock: endpoint http://127.0.0.1:9 refused",
        )
    ]


def test_a_failed_step_is_named_once_with_its_root_cause():
    res = dg.materialize([fails], resources={"fine": _Fine()}, raise_on_error=False)
    assert step_failures(res.all_events) == [
        ("fails", "ValueError: the gpu_daily partition of 2024-01-01 is damaged")
    ]
