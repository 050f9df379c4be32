"""An object-store landing zone (`GPU_PIPELINE_RAW=s3://bucket/prefix`), read with the same
library as the lake (pyarrow's filesystems): its objects are mirrored into a folder of the parse
cache, and the run reads that folder as it reads a local landing zone — the same listing,
integrity checks, parse cache and ledger (file names are the objects' keys under the prefix).

The mirror downloads only objects it does not hold at their size and modification time, each
to a temporary file renamed into place (with the object's time: a timeless scrape is filed on
its day by it); a file whose object is gone is removed from the mirror, so the run sees it gone.
An object key that is not a plain relative path (`..`, empty parts) is not mirrored: the run
says so. One run mirrors a zone at a time (a lock file beside the mirror)."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import uuid
from pathlib import Path

SCHEMES = ("s3",)


class RemoteLandingError(Exception):
    """The object-store landing zone cannot be listed: one line saying why."""


def is_remote(root: str | os.PathLike) -> bool:
    return "://" in os.fspath(root)


def mirror_folder(uri: str, cache_dir: Path) -> Path:
    """The local folder that mirrors landing zone `uri` (in the parse cache's folder)."""
    return Path(cache_dir) / "_landing" / hashlib.sha256(uri.encode()).hexdigest()[:16]


def mirror(uri: str, cache_dir: Path) -> tuple[Path, list[str]]:
    """Bring the mirror of `uri` up to date: (its folder, the object keys not mirrored)."""
    import pyarrow.fs as pafs

    scheme = uri.partition("://")[0]
    if scheme not in SCHEMES:
        raise RemoteLandingError(f"landing zone {uri}: only {', '.join(SCHEMES)}:// is read")
    try:
        fs, base = pafs.FileSystem.from_uri(uri)
        base = base.rstrip("/")
        infos = fs.get_file_info(pafs.FileSelector(base, recursive=True))
    except (OSError, ValueError) as e:
        raise RemoteLandingError(
            f"landing zone {uri} cannot be listed: {str(e).splitlines()[0]}: nothing was read "
            "and no partition was changed"
        ) from None
    folder = mirror_folder(uri, cache_dir)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f"{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return folder, _sync(fs, base, infos, folder)


def _sync(fs, base: str, infos, folder: Path) -> list[str]:
    """Download what changed, remove what is gone, remember what the mirror holds."""
    import pyarrow.fs as pafs

    manifest = folder.parent / f"{folder.name}.json"  # beside the mirror, not in its listing
    try:
        held = json.loads(manifest.read_text())
    except (OSError, ValueError):
        held = {}
    now, refused = {}, []
    for info in infos:
        if info.type != pafs.FileType.File:
            continue
        key = info.path[len(base) + 1 :]
        parts = key.split("/")
        if any(p in ("", ".", "..") for p in parts):
            refused.append(key)
            continue
        mtime_ns = int(info.mtime_ns or 0)
        now[key] = [info.size, mtime_ns]
        local = folder.joinpath(*parts)
        if held.get(key) == now[key] and local.is_file():
            continue
        local.parent.mkdir(parents=True, exist_ok=True)
        tmp = local.with_name(f".{local.name}.{uuid.uuid4().hex}.part")
        with fs.open_input_stream(info.path) as src, open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 22)
        os.utime(tmp, ns=(mtime_ns, mtime_ns))
        tmp.replace(local)
    for key in set(held) - set(now):  # gone from the store: gone from the mirror
        (folder.joinpath(*key.split("/"))).unlink(missing_ok=True)
    tmp = manifest.with_name(f".{manifest.name}.{uuid.uuid4().hex}")
    tmp.write_text(json.dumps(now))
    tmp.replace(manifest)
    return refused


def landing_root(root: str, cache_dir: str | os.PathLike) -> tuple[Path, list[str]]:
    """The landing zone as a local folder to list: `root` itself (checked), or an object
    store's mirror brought up to date; and the object keys not mirrored. LandingRootError (one
    line) when it cannot be read."""
    from gpu_pipeline.lib.ingest.landing import LandingRootError, check_landing_root

    if not is_remote(root) or root.partition("://")[0] not in SCHEMES:
        return check_landing_root(root), []
    try:
        return mirror(root, Path(cache_dir))
    except RemoteLandingError as e:
        raise LandingRootError(str(e)) from None
