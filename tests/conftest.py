import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

# The longest test files go first, longest first: `make test` spreads files over three workers
# (pytest-xdist, --dist loadfile --no-loadscope-reorder) in collection order; a long file started
# last would run alone at the end. Seconds a file took in a suite on 2 cores (2026-11-27).
LONG_FIRST = (
    "test_e2e_server.py",  # 293
    "test_real_fleets.py",  # 292
    "test_object_store.py",  # 245
    "test_integrity.py",  # 234
    "test_integrity_properties.py",  # 221
    "test_pull.py",  # 210
    "test_ui_server.py",  # 187
    "test_landing_integrity.py",  # 146
    "test_fanout.py",  # 126
    "test_sql_integrity.py",  # 122
    "test_cli_executor.py",  # 105
    "test_notify.py",  # 92
)


def pytest_collection_modifyitems(config, items):
    def rank(item):
        name = item.path.name
        return LONG_FIRST.index(name) if name in LONG_FIRST else len(LONG_FIRST)

    items.sort(key=rank)  # stable: the order inside a file is kept
