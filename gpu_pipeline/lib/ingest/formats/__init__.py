"""One parser per input format, all producing the same long samples (`ParsedLines`).

Each module has `detect(data: bytes, name: str) -> bool` (the whole file's content: a module
looks at as much of it as it needs, never only a prefix when what it looks for may come later)
and `parse(text, ctx) -> ParsedLines`; `FORMATS` is the order they are tried in. Adding a
format touches one module, this list and tests.
"""

from gpu_pipeline.lib.ingest.formats import (
    dmon,
    exposition,
    nvidia_smi,
    nvidia_smi_xml,
    nvml_csv,
    prom_json,
    seed_csv,
)

FORMATS = {
    "prometheus_json": prom_json,
    "nvml_samples": nvml_csv,
    "seed_csv": seed_csv,
    "nvidia_smi_xml": nvidia_smi_xml,
    "nvidia_smi_dmon": dmon,
    "dcgm_exposition": exposition,
    # last: it also recognizes headerless rows that start with a time
    "nvidia_smi_csv": nvidia_smi,
}

# formats with several fields per record (a CSV row, a GPU of an XML snapshot): a record is
# accepted when one of its values is, a duplicate when all of them are duplicates
WIDE_FORMATS = frozenset(
    {"nvidia_smi_csv", "nvml_samples", "seed_csv", "nvidia_smi_xml", "nvidia_smi_dmon"}
)
