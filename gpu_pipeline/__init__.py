"""gpu_pipeline: how much of a GPU fleet's paid time is real work."""

__version__ = "0.1.0"
