"""One parser per input format, all producing the same long samples (`ParsedLines`).

Each module has `detect(head: str, name: str) -> bool` and `parse(text, ctx) -> ParsedLines`;
`FORMATS` is the order they are tried in. Adding a format touches one module, this list and tests.
"""

from gpu_pipeline.lib.ingest.formats import exposition, nvidia_smi, nvml_csv, prom_json, seed_csv

FORMATS = {
    "prometheus_json": prom_json,
    "nvml_samples": nvml_csv,
    "seed_csv": seed_csv,
    "nvidia_smi_csv": nvidia_smi,
    "dcgm_exposition": exposition,
}
