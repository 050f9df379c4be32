"""The parse cache's copy in an object store, for runs on machines that come and go (issue 35).

A lake in an object store keeps every cached parse at `<lake>/_ingest_cache/<key>/` too, the
same files as the local cache's `<key>/` folder (`cache.load_or_parse`): a run on a fresh pod
finds there what another pod parsed, by the same key (the parser's version, the file's content
hash, its name and the parse options), and downloads instead of parsing. A parse that touches
none of the run's days is not downloaded at all: its `meta.json` says which days it holds.

What comes down is checked as a local cache is: the hashes in `meta.json` of every Parquet file
it lists (`cache._cache_intact`), every field of `meta.json` (`cache._meta_ok`), and for a parse
of other days, that its quarantine came down; a damaged, partial or forged copy is parsed
again and uploaded over.
`meta.json` is uploaded last, so a parse is found only once every file it lists is there. The
copy only saves work: a store that cannot be read or written this run means a local parse, never
a failed run.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from pathlib import Path

META = "meta.json"


class SharedCache:
    """Cached parses below `base` on the pyarrow filesystem `fs` (the lake's)."""

    def __init__(self, fs, base: str):
        self.fs, self.base = fs, base.rstrip("/")

    def has(self, key: str) -> bool:
        """Is the parse `key` there (its meta.json, written last)?"""
        import pyarrow.fs as pafs

        try:
            return self.fs.get_file_info(f"{self.base}/{key}/{META}").type == pafs.FileType.File
        except OSError:
            return False

    def fetch_meta(self, key: str, cdir: Path) -> bool:
        """Bring the parse's meta.json and its quarantine (small; every run lists the files
        rejected whole) into a new local folder `cdir`, renamed into place whole as a local
        parse is; whether it came down whole (a file missing or unreadable in the store: not
        installed, and the run parses the file here). `cache.load_or_parse` checks every field
        of the meta.json before it reads anything by it."""
        tmp = cdir.parent / f".fetch-{uuid.uuid4().hex}"
        tmp.mkdir(parents=True)
        try:
            if not self._get(f"{key}/{META}", tmp / META):
                return False
            names = _listed_files(tmp / META)
            if names is None:  # unreadable, or naming a file outside its folder: parse here
                return False
            # installed only whole: a meta.json without its quarantine would be read as a
            # cached parse whose files are missing (every run scans the quarantine)
            if not all(self._get(f"{key}/{name}", tmp / name) for name in names["quarantine"]):
                return False
            # cached meanwhile by this machine: same content, keep it
            with contextlib.suppress(OSError):
                tmp.rename(cdir)
            return True
        finally:
            for f in tmp.glob("*") if tmp.exists() else ():
                f.unlink()
            if tmp.exists():
                tmp.rmdir()

    def fetch_files(self, key: str, cdir: Path, names: list[str]) -> None:
        """Download the files `names` of the parse that `cdir` does not hold yet (each written
        beside its place and renamed: a file is there whole or not at all; a name that is not a
        plain file name is never fetched)."""
        for name in names:
            if plain_name(name) and not (cdir / name).is_file():
                self._get(f"{key}/{name}", cdir / name)

    def put(self, key: str, cdir: Path) -> bool:
        """Upload the local parse `cdir` as `key`, meta.json last; whether it went up."""
        files = sorted(p for p in cdir.iterdir() if p.is_file() and p.name != META)
        try:
            self.fs.create_dir(f"{self.base}/{key}", recursive=True)
            for f in [*files, cdir / META]:
                with (
                    open(f, "rb") as src,
                    self.fs.open_output_stream(f"{self.base}/{key}/{f.name}") as dst,
                ):
                    while chunk := src.read(8 << 20):
                        dst.write(chunk)
        except OSError:
            return False
        return True

    def _get(self, rel: str, dest: Path) -> bool:
        tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex}.tmp")
        try:
            with self.fs.open_input_stream(f"{self.base}/{rel}") as src, open(tmp, "wb") as dst:
                while chunk := src.read(8 << 20):
                    dst.write(chunk)
            tmp.replace(dest)
            return True
        except (OSError, FileNotFoundError):
            tmp.unlink(missing_ok=True)
            return False


def plain_name(name: object) -> bool:
    """A file name of the parse's own folder: no separator, not `.` or `..`, not hidden."""
    return (
        isinstance(name, str)
        and bool(name)
        and name == Path(name).name
        and "\\" not in name
        and not name.startswith(".")
    )


def _listed_files(meta_path: Path) -> dict[str, list[str]] | None:
    """The files a fetched meta.json lists (its samples, series, quarantine and hashed files),
    or None when it cannot be read or names anything but a plain file of its folder: a copy
    from the store is not trusted to say where to read."""
    try:
        meta = json.loads(meta_path.read_text())
        lists = {
            "samples": list(meta["samples"]),
            "series": [s for s in meta["series"] if s],
            "quarantine": list(meta["quarantine"]),
            "sha256": list(meta["sha256"]),
        }
    except (ValueError, KeyError, TypeError, AttributeError, OSError):
        return None
    if not all(plain_name(n) for names in lists.values() for n in names):
        return None
    return lists
