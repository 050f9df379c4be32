"""Landing files -> the raw tables: listing, reading, format detection and parsing (formats/),
the parse cache, the day's assembly, and the Prometheus pull that lands files."""
