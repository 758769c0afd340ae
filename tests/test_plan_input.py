# test_plan_input.py -- plan files are bounded regular files read without blocking; a bad one is named in one line; only the stepping process reserves one.
import json
import os
import struct
import subprocess
import sys
import time

import pytest

from conftest import load_report, preload_env as _env, run_rtkit
from prmalloc_steps import alloc_docs, run_steps

pytestmark = pytest.mark.timeout(300)


def _plan_text(classes):
    """A plan file with a correct fingerprint (the fingerprint is FNV-1a over size, blocks, align)."""
    h = 1469598103934665603
    for c in classes:
        for b in struct.pack("<QQQ", *c):
            h = ((h ^ b) * 1099511628211) & (2**64 - 1)
    text = ("rtkit-malloc-plan 1\nspacing exact\nmin_size 32768\nreserved_bytes 0\n"
            f"fingerprint {h:016x}\nclasses {len(classes)}\n")
    return text + "".join(f"class {s} {b} {a}\n" for s, b, a in classes) + "end\n"


def test_fifo_plan_never_blocks(prm, tmp_path):
    fifo = tmp_path / "plan.fifo"
    os.mkfifo(fifo)
    proc = run_steps(prm, tmp_path, {"RTKIT_MALLOC_PLAN": str(fifo)}, timeout=20)
    assert proc.returncode == 0
    (doc,) = alloc_docs(tmp_path)
    assert "not a regular file" in doc["plan"]["rejected_reason"]
    assert proc.stderr.decode().count("\n") == 1 and "RTKIT_MALLOC_PLAN" in proc.stderr.decode()


def test_crafted_huge_plan_is_rejected_at_once(prm, tmp_path):
    plan = tmp_path / "huge.txt"
    plan.write_text(_plan_text([(256, 4294967295, 64)]))
    proc = run_steps(prm, tmp_path, {"RTKIT_MALLOC_PLAN": str(plan)}, timeout=20)
    assert proc.returncode == 0
    (doc,) = alloc_docs(tmp_path)
    assert "more than RTKIT_MALLOC_ARENA_LIMIT" in doc["plan"]["rejected_reason"]
    assert doc["plan"]["source"] != "loaded"


MARKS = "import ctypes\nm = ctypes.CDLL(None).rtkit_step_mark\nfor _ in range(10):\n    b = bytearray(1 << 20); m()\nprint('ran')\n"


@pytest.mark.parametrize("kind", ["missing", "dir", "fifo"])
def test_cli_plan_names_what_is_wrong(tmp_path, kind):
    # --plan and --set malloc_plan= behave alike: the job runs, one line before it names the file and why it is
    # not used, and the summary names the file given (not the plan the run then profiled and saved)
    target = tmp_path / "p"
    if kind == "dir":
        os.mkdir(target)
    elif kind == "fifo":
        os.mkfifo(target)
    why = {"missing": "no such file", "dir": "is a directory", "fifo": "not a regular file"}[kind]
    lines = []
    for route in (["--plan", str(target)], ["--set", f"malloc_plan={target}"]):
        run_dir = tmp_path / f"r{len(lines)}"
        proc = run_rtkit(["run", *route, "--run-dir", str(run_dir), "--", sys.executable, "-c", MARKS], timeout=120)
        assert proc.returncode == 0 and proc.stdout == "ran\n", proc.stderr
        said = [line for line in proc.stderr.splitlines() if line.startswith("rtkit run:")]
        assert len(said) == 1 and str(target) in said[0] and why in said[0] and "the job runs" in said[0], said
        alloc = [line for line in proc.stderr.splitlines() if line.startswith("rtkit: allocator:")]
        assert alloc and f"plan {target} not used" in alloc[0], proc.stderr
        assert load_report(str(run_dir))["allocator"]["plan"]["source"] == "profiled"
        lines.append(alloc[0].split(", arena hit rate")[0])  # the hit rates count the interpreter's start-up too
    assert lines[0] == lines[1]


def _rss_kib(pid):
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return 0


def test_helpers_never_reserve_the_plan(prm, tmp_path):
    plan = tmp_path / "plan.txt"
    plan.write_text(_plan_text([(256 << 20, 1, 4096)]))  # 256 MiB, pre-faulted where it is reserved
    env = _env(prm, {"RTKIT_MALLOC_PLAN": str(plan)})
    proc = subprocess.Popen(["sh", "-c", "sleep 2.5 & sleep 2.5 & sleep 2.5 & wait"], env=env)
    try:
        time.sleep(1.2)
        kids = open(f"/proc/{proc.pid}/task/{proc.pid}/children").read().split()
        rss = {p: _rss_kib(p) for p in [proc.pid, *map(int, kids)]}
    finally:
        proc.wait(timeout=20)
    assert len(rss) == 4
    assert all(r is not None and r < 64 << 10 for r in rss.values()), rss  # KiB: far below the plan's 256 MiB


def test_binary_plan_and_non_utf8_path_give_valid_json(prm, tmp_path):
    plan = os.path.join(os.fsencode(str(tmp_path)), b"plan-\xff.txt")
    with open(plan, "wb") as fh:
        fh.write(b"rtkit-malloc-plan 1\n\xff\xfe\x80 binary \x00\x01" + bytes(range(256)))
    env = _env(prm, {"RTKIT_RUN_DIR": str(tmp_path)})
    env_b = {os.fsencode(k): os.fsencode(v) for k, v in env.items()}
    env_b[b"RTKIT_MALLOC_PLAN"] = plan
    proc = subprocess.run([os.path.join(prm, "tests", "prmalloc_steps"), "3", "1M"], env=env_b,
                          capture_output=True, timeout=30)
    assert proc.returncode == 0
    (doc,) = alloc_docs(tmp_path)  # json.load succeeds
    assert doc["state"] != "off" and doc["plan"]["rejected_reason"]
    assert doc["config"]["malloc_plan"].endswith("plan-\ufffd.txt")
