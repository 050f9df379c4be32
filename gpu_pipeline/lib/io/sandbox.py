"""A process that can no longer write files: Linux Landlock, for the analyst SQL process.

`deny_writes(keep)` forbids this process (and its threads and children) to create, write,
truncate, rename into or remove any file or folder, except below `keep` (a private folder for
DuckDB to spill to). Reads are not restricted here: DuckDB's own `allowed_directories` limits
what SQL can read. Files already open (stdout) stay writable. It cannot be undone.

Landlock is unprivileged and has been in Linux since 5.13 (ABI 1); on a kernel without it the
function returns False and the SQL statement gate alone keeps analysts from writing.
"""

from __future__ import annotations

import ctypes
import os
import struct

SYS_CREATE_RULESET, SYS_ADD_RULE, SYS_RESTRICT_SELF = 444, 445, 446  # the same on every arch
CREATE_RULESET_VERSION = 1
RULE_PATH_BENEATH = 1
PR_SET_NO_NEW_PRIVS = 38

WRITE_FILE = 1 << 1
REMOVE_DIR = 1 << 4
REMOVE_FILE = 1 << 5
MAKE = sum(1 << b for b in range(6, 13))  # char, dir, reg, sock, fifo, block, sym
REFER = 1 << 13  # ABI 2: rename / link across folders
TRUNCATE = 1 << 14  # ABI 3


def abi() -> int:
    """The kernel's Landlock ABI version; 0 when Landlock is unavailable."""
    libc = ctypes.CDLL(None, use_errno=True)
    v = libc.syscall(SYS_CREATE_RULESET, None, 0, CREATE_RULESET_VERSION)
    return max(v, 0)


def deny_writes(keep: str | os.PathLike | None = None) -> bool:
    """Forbid every file write of this process except below `keep`. True when in force."""
    version = abi()
    if version < 1:
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    handled = WRITE_FILE | REMOVE_DIR | REMOVE_FILE | MAKE
    if version >= 2:
        handled |= REFER
    if version >= 3:
        handled |= TRUNCATE
    attr = struct.pack("Q", handled)  # struct landlock_ruleset_attr, fs rights only
    fd = libc.syscall(SYS_CREATE_RULESET, attr, len(attr), 0)
    if fd < 0:
        return False
    try:
        if keep is not None:
            dfd = os.open(keep, os.O_PATH | os.O_DIRECTORY)
            try:
                beneath = struct.pack("=Qi", handled, dfd)  # packed landlock_path_beneath_attr
                if libc.syscall(SYS_ADD_RULE, fd, RULE_PATH_BENEATH, beneath, 0) < 0:
                    return False
            finally:
                os.close(dfd)
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            return False
        return libc.syscall(SYS_RESTRICT_SELF, fd, 0) == 0
    finally:
        os.close(fd)
