# pool_room.py -- room checks for tier mode's pool (disk space, memory), shared by `rtkit run` and the capacity bench.
"""Leaf module (nothing of rtkit): each check returns the one line to show, or None when all is well."""
from __future__ import annotations

import os
from typing import Optional

GIB = 1 << 30


def free_bytes(path: str) -> Optional[int]:
    """Bytes an unprivileged writer may still use on the file system holding `path` (its folder when the
    file does not exist yet), or None when the folder is missing."""
    folder = path if os.path.isdir(path) else (os.path.dirname(os.path.abspath(path)) or ".")
    try:
        st = os.statvfs(folder)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def total_bytes(path: str) -> Optional[int]:
    folder = path if os.path.isdir(path) else (os.path.dirname(os.path.abspath(path)) or ".")
    try:
        st = os.statvfs(folder)
    except OSError:
        return None
    return st.f_blocks * st.f_frsize


def pool_room_problem(path: str, size: int) -> Optional[str]:
    """Why a pool of `size` bytes at `path` cannot be made, or None. A missing folder is left to the
    allocator (it says so itself and keeps the job in DRAM)."""
    if not path:
        return None
    total, free = total_bytes(path), free_bytes(path)
    if total is None or free is None:
        return None
    # a file already at the path is never replaced (docs/safety.md): the allocator refuses it with one line
    if os.path.lexists(path):
        return None
    old = 0
    if size > total:
        return (f"tier_pool_size={size / GIB:.1f}G is larger than the file system of tier_pool_path={path} "
                f"({total / GIB:.1f}G in all); lower tier_pool_size or put the pool on a larger disk")
    if size > free + old:
        return (f"tier_pool_path={path}: its file system has {(free + old) / GIB:.1f}G free, the pool needs "
                f"tier_pool_size={size / GIB:.1f}G; free some space, lower tier_pool_size or move tier_pool_path")
    return None


def mem_available() -> Optional[int]:
    """MemAvailable of /proc/meminfo in bytes (None where there is no such line)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def mem_total() -> Optional[int]:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
