# test_run_files.py -- what rtkit's own run files cost in disk writes: the allocator's per-step records appended once.
import glob
import json
import os
import subprocess
import sys

from conftest import preload_env as _env
from rtkit.report import alloc_steps

# N steps, each with a step mark, a 1 MiB block made and freed in it, and a stats write forced at its end: the most
# writes a run can make (a stats write happens at step marks only)
FORCED_WRITES = r"""
import ctypes, sys
lib = ctypes.CDLL(None)
lib.malloc.restype = ctypes.c_void_p
lib.free.argtypes = [ctypes.c_void_p]
for _ in range(int(sys.argv[1])):
    lib.free(lib.malloc(1 << 20))
    lib.rtkit_step_mark()
    if sys.argv[2] == "forced":
        lib.rtkit_malloc_write_stats()
print("steps-done")
"""


def _run(prm, run_dir, steps, mode):
    proc = subprocess.run([sys.executable, "-c", FORCED_WRITES, str(steps), mode], capture_output=True, text=True,
                          timeout=120, env=_env(prm, {"RTKIT_RUN_DIR": str(run_dir)}))
    assert proc.returncode == 0 and proc.stdout == "steps-done\n", proc.stderr[-3000:]
    (path,) = glob.glob(os.path.join(str(run_dir), "allocator-*.json"))
    return path


def test_allocator_run_files_grow_with_steps_not_with_rewrites(prm, tmp_path):
    """The allocator's stats file carried a 2,000-step ring of per-step records (~320 KB when full), rewritten whole
    at every write (every 0.5 s and at steps 1, 2, 4, ...): 0.33-0.38 MiB/s for the whole of the DCN example, a day's
    job ~30 GB. Each record is now appended once to a file of its own; a write rewrites only the small summary. With a
    write forced at every step (the most there can be), the bytes the allocator wrote are at most a summary per write
    and a record per step; the old rewrites of the ring grow with steps x writes."""
    steps = 400
    path = _run(prm, tmp_path, steps, "forced")
    size = os.path.getsize(path)
    with open(path) as fh:
        doc = json.load(fh)
    written = doc["run_files_written_bytes"] + size   # the count is of the files written before this one
    writes = steps + 8   # one a step, the exit's, and the marks' own at steps 1, 2, 4, ...
    # a summary is the file less any per-step list (as rtkit wrote it before, inside), twice over for the C writer's
    # layout against json's; a record is under 128 bytes
    summary = len(json.dumps({k: v for k, v in doc.items() if k != "per_step"}, indent=2))
    assert written <= writes * (2 * summary + 256) + steps * 128, (written, summary, size)
    # every step's record is there, once, in order
    recs = alloc_steps.read(str(tmp_path), doc["pid"])
    assert [r["step"] for r in recs] == list(range(steps)), [r["step"] for r in recs][:10]
    assert all(r["allocs"] >= 1 and r["bytes_allocated"] >= 1 << 20 for r in recs[1:]), recs[:3]


def test_the_step_files_take_turns_and_keep_the_latest_records(prm, tmp_path):
    """Records go to two files by chunks of 2,000 steps, each chunk's file made afresh: the files never grow beyond
    4,000 records, and together hold the latest 2,000 at least. A torn last line (a process killed while it
    appended) is skipped."""
    steps = 4500
    path = _run(prm, tmp_path, steps, "marks")
    with open(path) as fh:
        doc = json.load(fh)
    pid = doc["pid"]
    recs = alloc_steps.read(str(tmp_path), pid)
    assert [r["step"] for r in recs] == list(range(steps - 2000, steps))
    assert doc["per_step_written"] == steps and doc["per_step_kept"] == 2000
    lines = [len(open(p).read().splitlines()) for p in sorted(glob.glob(str(tmp_path / f"allocator-{pid}.steps.*")))]
    assert lines == [500 + 1, 2000 + 1], lines   # chunk 2 (steps 4000-4499) in file 0, chunk 1 in file 1; a header each
    with open(tmp_path / f"allocator-{pid}.steps.0.jsonl", "a") as fh:
        fh.write("[4500, 3, 1")   # torn
    assert alloc_steps.read(str(tmp_path), pid)[-1]["step"] == steps - 1
    # the report's allocator section has them as its per_step list, as before
    from rtkit.report import model
    ((_, data),) = model.read_child_files(str(tmp_path), "allocator")
    assert [r["step"] for r in data["per_step"]] == list(range(steps - 2000, steps))


def test_a_forked_child_writes_its_own_step_files(prm, tmp_path):
    script = r"""
import ctypes, os
lib = ctypes.CDLL(None)
for _ in range(5):
    lib.rtkit_step_mark()
pid = os.fork()
if pid == 0:
    for _ in range(3):
        lib.rtkit_step_mark()
    lib.rtkit_malloc_write_stats()
    os._exit(0)
os.waitpid(pid, 0)
lib.rtkit_malloc_write_stats()
print(pid)
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          env=_env(prm, {"RTKIT_RUN_DIR": str(tmp_path)}))
    assert proc.returncode == 0, proc.stderr[-3000:]
    child = int(proc.stdout)
    files = dict(model_read(tmp_path))
    # the child's files have the parent's records it inherited and its own; the parent's, its own only
    assert [r["step"] for r in files[child]["per_step"]] == list(range(8))
    parent = next(p for p in files if p != child)
    assert [r["step"] for r in files[parent]["per_step"]] == list(range(5))


def model_read(run_dir):
    from rtkit.report import model
    return model.read_child_files(str(run_dir), "allocator")


def test_steps_file_flushes_grow_with_steps_not_with_rewrites(tmp_path, monkeypatch):
    """The steps recorder rewrote steps-<pid>.json whole at every flush with all of its per-step records (95 bytes a
    step; every 5 s or more: a 100,000-step job rewrote ~9.5 MB each time). The records are now appended once each to
    steps-<pid>.records.jsonl; a flush rewrites the small summary. With a flush after every step (the most there can
    be), the bytes written are a summary per flush and a record per step; the report reads the records back."""
    from rtkit import atomic
    from rtkit.hooks import steps as steps_mod
    from rtkit.report import model

    monkeypatch.setenv("RTKIT_RUN_DIR", str(tmp_path))
    rec = steps_mod.StepRecorder()
    rec.step_mark = None
    rec.hook = {"status": "ok", "detail": None, "tensorflow_version": None}
    n = 600
    before = atomic.written_bytes
    for i in range(n):
        rec.record("manual", "rtkit.step()", 1.7e9 + i, 12.5, 3, "rtkit.step()")
        rec.flush()
    written = atomic.written_bytes - before
    with open(tmp_path / f"steps-{os.getpid()}.json") as fh:   # the file less any per-step list (old rtkit's)
        summary = len(json.dumps({k: v for k, v in json.load(fh).items() if k != "per_step"}))
    pages = -(-summary // 4096) * 4096 + 4096   # a summary in whole pages, and one for any growth on the way
    assert written <= n * pages + n * 128, (written, summary)
    ((pid, data),) = model.read_child_files(str(tmp_path), "steps")
    assert pid == os.getpid() and data["count"] == n and len(data["per_step"]) == n
    assert data["per_step"][-1] == {"t_unix": 1.7e9 + n - 1, "step_ms": 12.5, "minor_faults": 3,
                                    "rss_bytes": data["per_step"][-1]["rss_bytes"]}


def test_live_json_keeps_the_latest_records_of_each_per_step_list():
    """live.json was the whole report so far, every per-step list whole, rewritten every 2 s: 712 KB at 3,000 steps of
    wdl, 115-140 KiB/s of the parent's disk writes, growing with the run. It now keeps each list's latest records (the
    whole-run figures are computed before the cut; the exporters get the snapshot whole)."""
    from rtkit.live import snapshot

    n = 3000
    report = {"steps": {"count": n, "per_step": [{"step": i + 1, "step_ms": 1.0} for i in range(n)],
                        "summary": {"step_ms_median": 1.0}},
              "allocator": {"per_step": [{"step": i} for i in range(2000)], "steps": 2001},
              "process": {"samples": [{"t_s": i} for i in range(10)]}, "live": {"as_of_unix": 1.0}}
    out = snapshot.for_file(report)
    keep = snapshot.LIVE_RECORDS
    assert [s["step"] for s in out["steps"]["per_step"]] == list(range(n - keep + 1, n + 1))
    assert len(out["allocator"]["per_step"]) == keep and out["allocator"]["steps"] == 2001
    assert len(out["process"]["samples"]) == 10 and out["steps"]["summary"] == {"step_ms_median": 1.0}
    assert out["live"]["records_cut"] == {"steps.per_step": n - keep, "allocator.per_step": 2000 - keep}
    assert len(report["steps"]["per_step"]) == n and "records_cut" not in report["live"]   # the snapshot is whole
    assert len(json.dumps(out)) < 20_000 < len(json.dumps(report))
