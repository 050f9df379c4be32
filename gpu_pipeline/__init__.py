"""gpu_pipeline: how much of a GPU fleet's paid time is real work."""

from importlib.metadata import PackageNotFoundError, version

from gpu_pipeline import allocator

# before anything imports Polars: its allocator reads its settings once, at import
ALLOCATOR = allocator.configure()

try:
    __version__ = version("gpu_pipeline")  # pyproject.toml's, which follows CHANGELOG.md
except PackageNotFoundError:  # imported from a checkout that was never installed
    __version__ = "unknown"
