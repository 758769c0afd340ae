# browser.py -- headless Chromium for the report tests: find or install it, render a page, read the screenshot's pixels.
"""Debian's `chromium` package; when it is missing and we are root with apt-get, it is installed once
(`make browser-deps` does the same). Without it the browser tests skip with the reason."""
from __future__ import annotations

import os
import shutil
import struct
import subprocess
import zlib
from typing import List, Optional, Tuple

NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
         "--disable-extensions", "--enable-logging=stderr", "--v=0"]


def find() -> Optional[str]:
    for n in NAMES:
        path = shutil.which(n)
        if path:
            return path
    return None


def find_or_install() -> Tuple[Optional[str], str]:
    """(path, why not): installs Debian's chromium with apt-get when root; never fails the caller."""
    path = find()
    if path:
        return path, ""
    if os.environ.get("RTKIT_NO_BROWSER_INSTALL"):
        return None, "chromium not installed and RTKIT_NO_BROWSER_INSTALL is set (run `make browser-deps`)"
    if not shutil.which("apt-get"):
        return None, "chromium not installed and there is no apt-get here to install it"
    if os.geteuid() != 0:
        return None, "chromium not installed and installing it needs root (run `sudo make browser-deps`)"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    cmd = ["apt-get", "install", "-y", "--no-install-recommends", "chromium"]
    try:
        if subprocess.run(cmd, env=env, capture_output=True, timeout=900).returncode != 0:
            subprocess.run(["apt-get", "update"], env=env, capture_output=True, timeout=300)
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
            if proc.returncode != 0:
                tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["?"]
                return None, f"chromium could not be installed with apt-get (no network?): {tail[0]}"
    except subprocess.TimeoutExpired:
        return None, "installing chromium with apt-get timed out"
    path = find()
    return (path, "") if path else (None, "apt-get installed chromium but no chromium binary is on PATH")


def render(binary: str, url: str, png: str, width: int = 1000, height: int = 3000) -> Tuple[str, List[str]]:
    """(DOM after rendering, console lines) and a screenshot at `png`."""
    dom = subprocess.run([binary, *FLAGS, f"--window-size={width},{height}", "--dump-dom", url],
                         capture_output=True, text=True, timeout=120)
    shot = subprocess.run([binary, *FLAGS, f"--window-size={width},{height}", f"--screenshot={png}", url],
                          capture_output=True, text=True, timeout=120)
    console = [line for line in (dom.stderr + shot.stderr).splitlines() if ":CONSOLE" in line or "Uncaught" in line]
    if not os.path.isfile(png):
        raise AssertionError(f"chromium wrote no screenshot: {shot.stderr[-500:]}")
    return dom.stdout, console


def read_png(path: str) -> Tuple[int, int, List[bytes]]:
    """(width, height, rows of RGB(A) bytes) of an 8-bit RGB or RGBA PNG, such as Chromium's screenshots."""
    with open(path, "rb") as fh:
        data = fh.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            width, height, depth, ctype = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and ctype in (2, 6), f"unsupported PNG (depth {depth}, colour type {ctype})"
            bpp = 3 if ctype == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows: List[bytes] = []
    prev = bytearray(stride)
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return width, height, [bytes(r) for r in rows] if bpp == 3 else [_rgb(r) for r in rows]


def _rgb(rgba: bytes) -> bytes:
    return bytes(b for i, b in enumerate(rgba) if i % 4 != 3)


def count_colour(rows: List[bytes], hex_colour: str, tolerance: int = 12) -> int:
    """Pixels within `tolerance` of the colour (anti-aliasing blurs edges, the cores stay exact)."""
    import numpy as np

    want = np.frombuffer(bytes.fromhex(hex_colour.lstrip("#")), dtype=np.uint8).astype(np.int16)
    img = np.frombuffer(b"".join(rows), dtype=np.uint8).reshape(-1, 3).astype(np.int16)
    return int(np.all(np.abs(img - want) <= tolerance, axis=1).sum())
