"""A process that can no longer write files, nor read beyond what it names: Linux Landlock, for
the analyst SQL process.

`restrict(keep, read)` forbids this thread, and the threads and children it starts afterwards,
to create, write, truncate, rename into or remove any file or folder except below `keep` (a
private folder DuckDB may spill to); with `read` given, it may also open for reading only files
and folders below `keep` and below the paths (or `O_PATH` descriptors) of `read`. Landlock binds
a rule to the folder it names when the rule is made, not to its path: a folder swapped for a link
afterwards does not take the rule along. Files already open (stdin, stdout) stay usable. It
cannot be undone.

Landlock restricts only the calling thread and what it starts later; threads already running keep
their rights. So the SQL process calls it before DuckDB starts its worker threads (before
`duckdb.connect`). Landlock is unprivileged and has been in Linux since 5.13 (ABI 1); on a kernel
without it `restrict` returns False and the process runs unrestricted (the statement gate and
DuckDB's own file allow-list still stand).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import stat
import struct
import sys
import sysconfig
import tempfile
from collections.abc import Iterable
from pathlib import Path

SYS_CREATE_RULESET, SYS_ADD_RULE, SYS_RESTRICT_SELF = 444, 445, 446  # the same on every arch
CREATE_RULESET_VERSION = 1
RULE_PATH_BENEATH = 1
PR_SET_NO_NEW_PRIVS = 38

EXECUTE = 1 << 0
WRITE_FILE = 1 << 1
READ_FILE = 1 << 2
READ_DIR = 1 << 3
REMOVE_DIR = 1 << 4
REMOVE_FILE = 1 << 5
MAKE = sum(1 << b for b in range(6, 13))  # char, dir, reg, sock, fifo, block, sym
REFER = 1 << 13  # ABI 2: rename / link across folders
TRUNCATE = 1 << 14  # ABI 3
READS = READ_FILE | READ_DIR
# the rights a rule on a file (not a folder) may carry
FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE


def abi() -> int:
    """The kernel's Landlock ABI version; 0 when Landlock is unavailable."""
    libc = ctypes.CDLL(None, use_errno=True)
    v = libc.syscall(SYS_CREATE_RULESET, None, 0, CREATE_RULESET_VERSION)
    return max(v, 0)


# descriptors kept open for the life of the process, so the files their rules name stay the same
_PINNED: list[int] = []


def runtime_paths() -> list[str | int]:
    """What this Python process may still need to read once restricted: the standard library,
    site-packages, this package and the folders of the shared libraries already loaded (Python
    imports modules, and dlopen()s their libraries, lazily); time zone data; and what DuckDB reads
    to size its thread pool (this process's cgroup, the CPUs online). Not the working directory,
    the home folder, `sys.path[0]`, /etc or /proc."""
    paths: set[str] = {
        sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")
    }
    paths |= {p for p in sys.path if p.endswith(("site-packages", "dist-packages"))}
    paths.add(str(Path(__file__).resolve().parents[2]))  # the gpu_pipeline package
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(maxsplit=5)
                if len(parts) == 6 and parts[5].startswith("/") and ".so" in parts[5]:
                    paths.add(os.path.dirname(parts[5].rstrip("\n").removesuffix(" (deleted)")))
    except OSError:
        pass
    # time zone data (ICU and Python read it on first use); CPUs and cgroup limits (DuckDB reads
    # them whenever its thread count is set, and fails without them)
    paths |= {"/usr/share/zoneinfo", "/etc/localtime", "/sys/fs/cgroup", "/sys/devices/system/cpu"}
    out: list[str | int] = sorted(p for p in paths if p and os.path.exists(p))
    # /proc/self/cgroup alone, not /proc: a /proc/<pid> file's inode lasts as long as a reference
    # to it, so the descriptor the rule is made from stays open
    if not _PINNED:
        with contextlib.suppress(OSError):
            _PINNED.append(os.open("/proc/self/cgroup", os.O_PATH | os.O_CLOEXEC))
    return out + _PINNED


def open_dir(path: str | os.PathLike) -> int:
    """An O_PATH descriptor of the folder `path` (a real path), for a read rule; OSError when
    what was opened is not that folder (a component swapped for a link meanwhile)."""
    fd = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        opened = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        opened = os.fspath(path)  # no /proc: O_NOFOLLOW alone checked the last component
    if opened != os.fspath(path):
        os.close(fd)
        raise OSError(f"{path} changed while it was opened (now {opened})")
    return fd


def private_dir() -> tuple[Path, Path] | None:
    """A new folder of this process, below a per-user folder only this user can enter
    (`<tmp>/gpu-pipeline-sql-<uid>/<pid>-…`): (the per-user folder, the new one), or None when
    the per-user folder is not safely ours. Folders of processes that are gone are removed."""
    parent = Path(tempfile.gettempdir()) / f"gpu-pipeline-sql-{os.getuid()}"
    try:
        parent.mkdir(mode=0o700, exist_ok=True)
        st = os.lstat(parent)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
            return None
        for old in parent.iterdir():
            pid = old.name.split("-", 1)[0]
            if pid.isdigit() and not _alive(int(pid)):
                shutil.rmtree(old, ignore_errors=True)
        return parent, Path(tempfile.mkdtemp(prefix=f"{os.getpid()}-", dir=parent))
    except OSError:
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def restrict(
    keep: str | os.PathLike | None = None,
    read: Iterable[str | os.PathLike | int] | None = None,
) -> bool:
    """Forbid every file write of this thread (and what it starts later) except below `keep`;
    with `read`, every read too except below `keep` and below `read` (paths, or descriptors
    opened with O_PATH, whose rule then binds to exactly what was opened). True when in force."""
    version = abi()
    if version < 1:
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    handled = WRITE_FILE | REMOVE_DIR | REMOVE_FILE | MAKE
    if version >= 2:
        handled |= REFER
    if version >= 3:
        handled |= TRUNCATE
    if read is not None:
        handled |= READS
    attr = struct.pack("Q", handled)  # struct landlock_ruleset_attr, fs rights only
    fd = libc.syscall(SYS_CREATE_RULESET, attr, len(attr), 0)
    if fd < 0:
        return False

    def allow(target: str | os.PathLike | int, rights: int) -> bool:
        own = not isinstance(target, int)
        dfd = os.open(target, os.O_PATH | os.O_CLOEXEC) if own else target
        try:
            if not stat.S_ISDIR(os.fstat(dfd).st_mode):
                rights &= FILE_RIGHTS
            beneath = struct.pack("=Qi", rights & handled, dfd)  # landlock_path_beneath_attr
            return libc.syscall(SYS_ADD_RULE, fd, RULE_PATH_BENEATH, beneath, 0) == 0
        finally:
            if own:
                os.close(dfd)

    try:
        if keep is not None and not allow(keep, handled):
            return False
        for target in read or ():
            try:
                if not allow(target, READS):
                    return False
            except OSError:  # a path gone or unreadable: nothing to allow
                continue
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            return False
        return libc.syscall(SYS_RESTRICT_SELF, fd, 0) == 0
    finally:
        os.close(fd)


def deny_writes(keep: str | os.PathLike | None = None) -> bool:
    """Forbid every file write of this thread (and what it starts later) except below `keep`."""
    return restrict(keep)
