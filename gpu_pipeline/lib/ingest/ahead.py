"""New landing files parsed before a run reads them, with progress (`parse_new`), and, for a
command that starts a run, in a process of their own while the run starts (`Ahead`).

A CLI run spends its first seconds single-threaded: importing Dagster and the definitions,
resolving the resources, checking the reference files. The parse of a large landing zone keeps
both cores busy for several seconds more. Parsed in a second process started first, the files
are in the parse cache by the time the run looks for them: the run finds them cached and reads
the cache, as a second run would (issue 34; `benchmarks/README.md`). Nothing else changes: the
same parse, the same cache, the same progress lines. If that process fails or is stopped,
the run parses what it left, as it always did.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Collection
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpu_pipeline.lib.ingest.landing import ParseOptions
    from gpu_pipeline.lib.ingest.shared_cache import SharedCache

Say = Callable[[str], None]

# a landing zone smaller than this is parsed by the run itself: a second process (~0.4 s to
# start) gains nothing on a few files
AHEAD_BYTES = 256 * 2**20
# the line the parse process ends with: the cached parses it wrote or found intact
CHECKED = "@checked "


def parse_new(
    root: Path,
    cache: Path,
    opts: ParseOptions,
    say: Say,
    days: Collection[date] | None = None,
    shared: SharedCache | None = None,
) -> list:
    """Every landing file below `root` parsed into `cache` (the new ones first, with progress
    said every tenth of them), as `parse_all` returns them. New files are hashed by their parse
    (read once) and the memo learns their hashes; beside a lake in an object store (`shared`,
    the parse cache's copy there) they are hashed first, to be looked up in that copy."""
    from gpu_pipeline.lib.ingest.cache import is_cached, parse_all
    from gpu_pipeline.lib.ingest.landing import hash_memo, list_landing, remember_hashes

    files = list_landing(root, hash_memo(cache), hash_new=shared is not None)
    todo = [f for f in files if not is_cached(f, cache, opts, shared)]
    if not todo:
        return parse_all(files, cache, opts, days=days, shared=shared)
    total = sum(f.size for f in todo)
    say(f"parsing {len(todo)} new landing file(s), {total / 2**20:,.0f} MiB")
    t, step = time.perf_counter(), max(1, len(todo) // 10)
    progress = {"files": 0, "bytes": 0}
    lock = threading.Lock()

    def done(f, _parsed) -> None:
        with lock:  # files finish in any order, a few at a time
            progress["files"] += 1
            progress["bytes"] += f.size
            i = progress["files"]
            if i % step == 0 or i == len(todo):
                rate = progress["bytes"] / 2**20 / max(time.perf_counter() - t, 1e-9)
                say(f"  parsed {i}/{len(todo)} files ({rate:,.0f} MiB/s)")

    parsed = parse_all(files, cache, opts, done, days, shared)
    remember_hashes(hash_memo(cache), [pf.file for pf in parsed])
    return parsed


def landing_bytes(root: Path, enough: int) -> int:
    """The bytes of the regular files below `root` (links not followed, hidden names skipped),
    counted until `enough` is reached."""
    total = 0
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in names:
            if name.startswith("."):
                continue
            try:
                st = os.lstat(os.path.join(folder, name))
            except OSError:
                continue
            if st.st_mode & 0o170000 == 0o100000:  # a regular file
                total += st.st_size
                if total >= enough:
                    return total
    return total


class Ahead:
    """`parse_new` in a process of its own (`python -m gpu_pipeline.lib.ingest.ahead`), its
    progress lines said by the caller's `say` as they come. Starting it imports nothing heavy
    (the parse's modules are imported by `parse_new`, in that process): it starts at once."""

    def __init__(self, proc: subprocess.Popen, say: Say, cache: Path | None = None):
        self.proc, self.cache = proc, cache
        self.checked: dict = {}  # the cached parses it wrote or found intact (`cache.checked`)
        self.reader = threading.Thread(target=self._relay, args=(say,), daemon=True)
        self.reader.start()

    def _relay(self, say: Say) -> None:
        for line in self.proc.stdout:
            if line.startswith(CHECKED):
                try:
                    self.checked = json.loads(line[len(CHECKED) :])
                except ValueError:
                    self.checked = {}
                continue
            say(line.rstrip("\n"))

    @classmethod
    def start(
        cls,
        raw: str,
        cache: Path,
        csv_timezone: str,
        max_file_bytes: int,
        say: Say,
        min_bytes: int | None = None,
    ) -> Ahead | None:
        """Start the parse of `raw` (a local landing zone) into `cache` with the parse options
        `csv_timezone` and `max_file_bytes` (`ParseOptions`: options it refuses fail that
        process alone), when the zone holds at least `min_bytes`; None when it is not started
        (an object store, a small zone, no process can be started). `min_bytes`: AHEAD_BYTES
        when None."""
        min_bytes = AHEAD_BYTES if min_bytes is None else min_bytes
        root = Path(raw)
        if "://" in raw or not root.is_dir() or landing_bytes(root, min_bytes) < min_bytes:
            return None
        args = [str(root), str(cache), csv_timezone, str(max_file_bytes)]
        from gpu_pipeline.allocator import parse_process_env

        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "gpu_pipeline.lib.ingest.ahead", *args],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                # its failure is the run's to find again: the run parses what is left
                stderr=subprocess.DEVNULL,
                text=True,
                env=parse_process_env(dict(os.environ)),  # keeps what it frees: it exits soon
            )
        except OSError:
            return None
        return cls(proc, say, cache)

    def join(self) -> bool:
        """Wait for the parse to end; whether it ended well. The cached parses it wrote or found
        intact are not hashed again by this process while their files stay as they were."""
        code = self.proc.wait()
        self.reader.join()
        if self.checked:
            from gpu_pipeline.lib.ingest.cache import trust_checked

            trust_checked(self.checked)
        return code == 0

    def stop(self) -> None:
        """End the parse now, if it still runs (the run stops before reading it)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self._sweep()
        self.reader.join(timeout=10)

    def _sweep(self) -> None:
        """Remove the parses it was writing when stopped (named by its process id)."""
        from gpu_pipeline.lib.ingest.cache import TMP_PREFIX

        if self.cache is not None and self.cache.is_dir():
            for folder in self.cache.glob(f"{TMP_PREFIX}{self.proc.pid}-*"):
                shutil.rmtree(folder, ignore_errors=True)


def main(argv: list[str]) -> int:
    from gpu_pipeline.lib.ingest.landing import ParseOptions

    root, cache, tz, max_bytes = argv

    def say(line: str) -> None:
        print(line, flush=True)

    parse_new(Path(root), Path(cache), ParseOptions(tz, int(max_bytes)), say)
    from gpu_pipeline.lib.ingest.cache import checked

    say(CHECKED + json.dumps(checked()))
    return 0


if __name__ == "__main__":  # `gpu_pipeline` was imported first: its allocator settings hold
    sys.exit(main(sys.argv[1:]))
