"""Imported at start-up by every process of a test's `dagster dev` (tests/servers.py, `dg_dev`,
puts this folder on PYTHONPATH): Dagster's daemon loops (backfills, automation) wait a fixed 30 s
between iterations (`dagster._daemon.controller.DEFAULT_DAEMON_INTERVAL_SECONDS`, no setting);
with GPU_PIPELINE_TEST_DAEMON_INTERVAL set they wait that many seconds instead. The product's
`dagster dev` keeps Dagster's default: only the waiting of the tests is shortened."""

import os
import sys

_INTERVAL = os.environ.get("GPU_PIPELINE_TEST_DAEMON_INTERVAL")

if _INTERVAL:
    import importlib.abc
    import importlib.util

    class _Interval(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != "dagster._daemon.controller":
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(name)
            run = spec.loader.exec_module

            def exec_module(module):
                run(module)
                module.DEFAULT_DAEMON_INTERVAL_SECONDS = int(_INTERVAL)

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _Interval())
