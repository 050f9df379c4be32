import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

# The longest test files go first: `make test` spreads files over two workers (pytest-xdist,
# --dist loadfile --no-loadscope-reorder) in collection order; a long file started last would
# run alone at the end.
LONG_FIRST = ("test_e2e_server.py", "test_real_fleets.py", "test_integrity.py", "test_ui_server.py")


def pytest_collection_modifyitems(config, items):
    def rank(item):
        name = item.path.name
        return LONG_FIRST.index(name) if name in LONG_FIRST else len(LONG_FIRST)

    items.sort(key=rank)  # stable: the order inside a file is kept
