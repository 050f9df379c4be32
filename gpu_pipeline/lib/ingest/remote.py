"""An object-store landing zone (`GPU_PIPELINE_RAW=s3://bucket/prefix`), read with the same
library as the lake (pyarrow's filesystems): its objects are mirrored into a folder of the parse
cache, and the run reads that folder as it reads a local landing zone — the same listing,
integrity checks, parse cache and ledger (file names are the objects' keys under the prefix).

Each run makes the mirror what the store lists, whatever an earlier run left (one stopped
midway included): a local file that is not an object of the listing is removed (the run sees it
gone), and an object is downloaded unless the mirror holds it at its size and modification
time, to a temporary file outside the mirror renamed into place (with the object's time: a
timeless scrape is filed on its day by it). An object that cannot be mirrored is skipped, and
the run says which and why (`Unmirrored`): a key that is not a plain relative path (`..`,
empty parts, a trailing `/`), a key that is also the folder of other keys (a local folder cannot
be a file too), one deleted after the listing or that cannot be downloaded or written here (a
name too long for the local disk); the other objects are mirrored. One run mirrors a zone at a
time (a lock file beside the mirror)."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import stat
import uuid
from pathlib import Path

SCHEMES = ("s3",)

NOT_PLAIN = "not a plain relative path (`..`, `.` or an empty part)"
ALSO_FOLDER = (
    "its key is also the folder of other objects' keys: a local folder cannot be a file too"
)
ENDS_IN_SLASH = "its key ends in `/` (a folder marker with content): not a plain relative path"
GONE = "deleted from the store after it was listed"


class RemoteLandingError(Exception):
    """The object-store landing zone cannot be listed: one line saying why."""


class Unmirrored(str):
    """An object the mirror does not hold: its key (the text), and `why`."""

    why: str

    def __new__(cls, key: str, why: str) -> Unmirrored:
        out = super().__new__(cls, key)
        out.why = why
        return out


def is_remote(root: str | os.PathLike) -> bool:
    return "://" in os.fspath(root)


def mirror_folder(uri: str, cache_dir: Path) -> Path:
    """The local folder that mirrors landing zone `uri` (in the parse cache's folder)."""
    return Path(cache_dir) / "_landing" / hashlib.sha256(uri.encode()).hexdigest()[:16]


def mirror(uri: str, cache_dir: Path) -> tuple[Path, list[Unmirrored]]:
    """Bring the mirror of `uri` up to date: (its folder, the objects not mirrored)."""
    import pyarrow.fs as pafs

    scheme = uri.partition("://")[0]
    if scheme not in SCHEMES:
        raise RemoteLandingError(f"landing zone {uri}: only {', '.join(SCHEMES)}:// is read")
    try:
        fs, base = pafs.FileSystem.from_uri(uri)
        base = base.rstrip("/")
        # a prefix without objects is an empty landing zone (a fresh deploy, retention emptied
        # it: an object store has no empty folders), not one that cannot be listed; a bucket
        # that does not exist is
        infos = fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
        bucket = base.split("/", 1)[0]
        if not infos and fs.get_file_info(bucket).type == pafs.FileType.NotFound:
            raise FileNotFoundError(f"bucket {bucket!r} does not exist")
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


def _sync(fs, base: str, infos, folder: Path) -> list[Unmirrored]:
    """Make the mirror hold exactly the listed objects it can: remove what is not listed,
    download what changed; the objects not mirrored, each with why."""
    wanted, refused = _listed(base, infos)
    # downloads are staged beside the mirror, never in it (a leftover is never listed); under
    # the lock, whatever is there was left by a run that stopped
    staging = folder.parent / f"{folder.name}.part"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    (folder.parent / f"{folder.name}.json").unlink(missing_ok=True)  # an earlier version's
    _prune(folder, set(wanted))
    for key, info in wanted.items():
        why = _fetch(fs, info, folder.joinpath(*key.split("/")), staging)
        if why:  # `key/` with content is listed as `key`: named as it is in the store
            refused.append(Unmirrored(f"{key}/" if why == ENDS_IN_SLASH else key, why))
    shutil.rmtree(staging, ignore_errors=True)
    return sorted(refused)


def _listed(base: str, infos) -> tuple[dict, list[Unmirrored]]:
    """The listing's objects as {key: info} of those a local folder can hold, and the others."""
    import pyarrow.fs as pafs

    files = {i.path[len(base) + 1 :]: i for i in infos if i.type == pafs.FileType.File}
    plain = {k for k in files if not any(p in ("", ".", "..") for p in k.split("/"))}
    folders = {k.rsplit("/", n)[0] for k in plain for n in range(1, k.count("/") + 1)}
    wanted, refused = {}, []
    for key in sorted(files):
        if key not in plain:
            refused.append(Unmirrored(key, NOT_PLAIN))
        elif key in folders:
            refused.append(Unmirrored(key, ALSO_FOLDER))
        else:
            wanted[key] = files[key]
    return wanted, refused


def _prune(folder: Path, keep: set[str], rel: str = "") -> bool:
    """Remove every file below `folder` whose path is not in `keep` (a download stopped
    midway, an object deleted since, whatever a run left) and the folders left empty; whether
    `folder` is empty now."""
    empty = True
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return False
    for e in entries:
        key = f"{rel}{e.name}"
        if e.is_dir(follow_symlinks=False) and key not in keep:
            if _prune(Path(e.path), keep, f"{key}/"):
                with contextlib.suppress(OSError):
                    os.rmdir(e.path)
                    continue
            empty = False
        elif key in keep and not e.is_dir(follow_symlinks=False):
            empty = False
        else:  # not listed, or a folder where an object is now
            _remove(Path(e.path))
    return empty


def _remove(path: Path) -> None:
    with contextlib.suppress(OSError):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)


def _fetch(fs, info, local: Path, staging: Path) -> str | None:
    """Download the object `info` to `local` unless it is there at its size and time; why it
    could not be (None: mirrored). A failed download leaves no version of it in the mirror."""
    mtime_ns = int(info.mtime_ns or 0)
    with contextlib.suppress(OSError):
        st = os.stat(local, follow_symlinks=False)
        if stat.S_ISREG(st.st_mode) and (st.st_size, st.st_mtime_ns) == (info.size, mtime_ns):
            return None
    tmp = staging / uuid.uuid4().hex
    try:
        with fs.open_input_stream(info.path) as src, open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 22)
        os.utime(tmp, ns=(mtime_ns, mtime_ns))
        local.parent.mkdir(parents=True, exist_ok=True)
        tmp.replace(local)
        return None
    except (OSError, ValueError) as e:
        tmp.unlink(missing_ok=True)
        _remove(local)  # the store's version could not be had: the run reads no other
        return _why(fs, info, e)


def _why(fs, info, e: Exception) -> str:
    """Why the object `info` could not be mirrored (`e`: what its download raised)."""
    import pyarrow.fs as pafs

    if isinstance(e, FileNotFoundError):  # listed, then not found: which?
        try:
            now = fs.get_file_info(info.path).type
        except (OSError, ValueError):
            now = None
        if now == pafs.FileType.NotFound:
            return GONE
        if now == pafs.FileType.Directory:  # `key/` with content, listed as `key`
            return ENDS_IN_SLASH
    detail = (e.strerror if isinstance(e, OSError) else None) or str(e).splitlines()[0]
    return f"cannot be mirrored: {detail}"


def landing_root(root: str, cache_dir: str | os.PathLike) -> tuple[Path, list[Unmirrored]]:
    """The landing zone as a local folder to list: `root` itself (checked), or an object
    store's mirror brought up to date; and the objects not mirrored (`Unmirrored`: the key,
    and `why`). LandingRootError (one line) when it cannot be read."""
    from gpu_pipeline.lib.ingest.landing import LandingRootError, check_landing_root

    if not is_remote(root) or root.partition("://")[0] not in SCHEMES:
        return check_landing_root(root), []
    try:
        return mirror(root, Path(cache_dir))
    except RemoteLandingError as e:
        raise LandingRootError(str(e)) from None
