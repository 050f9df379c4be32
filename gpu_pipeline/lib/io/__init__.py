"""Where data is stored and shown: the Parquet lake, the DuckDB views, the HTML report, the NVML
sampler and the read-only SQL sandbox."""
