# atomic.py -- the one way rtkit writes a file: a fresh temporary beside it, then a rename over it.
"""Readers (the parent assembling a report, a user's viewer, a later run) see the old file or the new one,
never half of one. The temporary is created with O_EXCL|O_NOFOLLOW under a unique name, so a planted link or
a concurrent writer is never written through; its mode honours the umask. This module imports nothing of rtkit
and runs in the child too (step and scheduler files), so it stays small."""
from __future__ import annotations

import contextlib
import json
import os
from typing import Any, Iterator, IO

_counter = 0
# Bytes this process wrote through this module: the child's own run files (steps-, scheduler-...) are part of its disk
# writes (/proc/PID/io), which the report would otherwise lay at the pool's door. A forked child starts at 0, as the
# kernel's count of its writes does.
written_bytes = 0


def _forget_written_bytes() -> None:
    global written_bytes
    written_bytes = 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_written_bytes)


def _temp_path(path: str) -> str:
    global _counter
    _counter += 1
    folder, name = os.path.split(os.path.abspath(path))
    return os.path.join(folder, f".{name}.tmp-{os.getpid()}-{_counter}")


@contextlib.contextmanager
def replacing(path: str, binary: bool = False, fsync: bool = False) -> Iterator[IO]:
    """Open a temporary file for writing; on a clean exit it replaces `path`, on an error it is removed."""
    tmp = _temp_path(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0),
                 0o666)
    try:
        # text: a lone surrogate (a non-UTF-8 byte of a path or argv) is written escaped, never raises
        with (os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace")) as fh:
            yield fh
            if fsync:  # for large files another process may read right after a crash
                fh.flush()
                os.fsync(fh.fileno())
            fh.flush()
            size = os.fstat(fh.fileno()).st_size
        global written_bytes
        written_bytes += pages(size)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def pages(size: int) -> int:
    """`size` bytes in whole 4 KiB pages: the kernel counts a fresh file's writes so (/proc/PID/io write_bytes)."""
    return -(-size // 4096) * 4096


def count_appended(old_size: int, new_size: int) -> None:
    """A file grew from old_size to new_size by an append: the pages it began (the last page, partly written before,
    is most likely dirty still and not counted again)."""
    global written_bytes
    written_bytes += pages(new_size) - pages(old_size)


def write_text(path: str, text: str) -> None:
    with replacing(path) as fh:
        fh.write(text)


def write_json(path: str, obj: Any, indent: int | None = 1) -> None:
    """JSON with a final newline; indent=None for the compact form files rewritten often use."""
    with replacing(path) as fh:
        json.dump(obj, fh, indent=indent, default=str)
        if indent is not None:
            fh.write("\n")
