"""The parse cache's copy in an object store (lib/ingest/shared_cache.py), on a local pyarrow
filesystem: what another machine parsed is used, what a tampered copy names outside its folder
is never read or written."""

import json
import shutil
from datetime import date

import pyarrow.fs as pafs
from helpers import MODELS, expo_lines, write_file

from gpu_pipeline.lib.ingest.cache import load_or_parse
from gpu_pipeline.lib.ingest.landing import list_landing
from gpu_pipeline.lib.ingest.shared_cache import SharedCache

D = date(2024, 1, 1)


def _landed(tmp_path):
    lines = expo_lines("GPU-a", MODELS["A100"], "n1", "team", D, range(30), 70, 250.0)
    write_file(tmp_path / "raw" / f"n1_{D}.prom", lines)
    (f,) = list_landing(tmp_path / "raw")
    return f


def test_a_copy_is_used_and_a_tampered_one_is_not_trusted(tmp_path):
    f = _landed(tmp_path)
    store = SharedCache(pafs.LocalFileSystem(), str(tmp_path / "store"))
    first = load_or_parse(f, tmp_path / "a", shared=store)
    (key,) = [p.name for p in (tmp_path / "store").iterdir()]
    assert (tmp_path / "store" / key / "meta.json").is_file()
    # another machine: the copy comes down (no parse: its samples are the store's bytes)
    second = load_or_parse(f, tmp_path / "b", days=[D], shared=store)
    assert second.samples.collect().equals(first.samples.collect())
    for p in (tmp_path / "store" / key).iterdir():
        assert (tmp_path / "b" / key / p.name).read_bytes() == p.read_bytes()
    # a copy whose meta.json names a file outside its folder: not installed, parsed here
    outside = tmp_path / "outside.parquet"
    shutil.copy(next((tmp_path / "store" / key).glob("quarantine*")), outside)
    meta_path = tmp_path / "store" / key / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["quarantine"] = ["../../outside.parquet"]
    meta_path.write_text(json.dumps(meta))
    assert not store.fetch_meta(key, tmp_path / "c" / key)
    assert not (tmp_path / "c" / key).exists()
    third = load_or_parse(f, tmp_path / "c", days=[date(2030, 1, 1)], shared=store)
    assert json.loads((tmp_path / "c" / key / "meta.json").read_text())["quarantine"] != [
        "../../outside.parquet"
    ]
    assert third.samples.collect().equals(first.samples.collect())
    # the parse here replaced the tampered copy in the store
    assert json.loads(meta_path.read_text())["quarantine"] != ["../../outside.parquet"]
