# test_file_safety.py -- the files rtkit and its libraries write: never through a planted link, umask honoured, a full disk or a refused write leaves no half file.
import glob
import json
import os
import stat
import subprocess
import sys

import pytest

from conftest import RTKIT, load_report, run_rtkit
from prmalloc_steps import alloc_docs, run_steps

pytestmark = pytest.mark.timeout(300)


def test_c_writes_never_follow_planted_links(prm, tmp_path):
    run_dir, victim = tmp_path / "shared", tmp_path / "victim.txt"
    run_dir.mkdir()
    victim.write_text("precious\n")
    last = int(open("/proc/sys/kernel/ns_last_pid").read())
    for pid in range(last + 1, last + 400):  # the next pids, under the old and the new temporary names
        for name in (f"allocator-{pid}.json.tmp.{pid}", f"allocator-{pid}.json.tmp.{pid}.1",
                     f"malloc-plan.txt.tmp.{pid}", f"malloc-plan.txt.tmp.{pid}.1"):
            os.symlink(victim, run_dir / name)
    proc = run_steps(prm, run_dir, {"RTKIT_MALLOC_PROFILE_START": "0", "RTKIT_MALLOC_PROFILE_STABLE": "2"},
                  args=("6", "1M"))
    assert proc.returncode == 0, proc.stderr
    assert victim.read_text() == "precious\n"
    docs = alloc_docs(run_dir)
    assert docs and docs[0]["steps"] == 6


def test_c_files_honour_the_umask(prm, tmp_path):
    proc = run_steps(prm, tmp_path, umask=0o077)
    assert proc.returncode == 0
    for f in glob.glob(str(tmp_path / "allocator-*.json")):
        assert stat.S_IMODE(os.stat(f).st_mode) == 0o600


def test_run_dir_rules_and_report_mode(tmp_path):
    used = tmp_path / "used"
    used.mkdir()
    (used / "allocator-1.json").write_text("{}")  # a previous run's file must never merge into a new report
    proc = run_rtkit(["run", "--run-dir", str(used), "--", sys.executable, "-c", "pass"])
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and "not empty" in proc.stderr
    afile = tmp_path / "afile"
    afile.write_text("x")
    proc = run_rtkit(["run", "--run-dir", str(afile), "--", sys.executable, "-c", "pass"])
    assert proc.returncode == 2 and "not a directory" in proc.stderr
    if os.getuid() == 0:  # root can hand a folder to another user
        theirs = tmp_path / "theirs"
        theirs.mkdir()
        os.chown(theirs, 54321, 54321)
        proc = run_rtkit(["run", "--run-dir", str(theirs), "--", sys.executable, "-c", "pass"])
        assert proc.returncode == 2 and "another user" in proc.stderr
    out = tmp_path / "out"
    proc = subprocess.run(["sh", "-c", 'umask 077; exec "$@"', "sh", RTKIT, "run", "--out", str(out), "--html",
                           "--set", "malloc=0", "--", sys.executable, "-c", "pass"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    (run_dir,) = glob.glob(str(out / "*"))
    assert stat.S_IMODE(os.stat(run_dir).st_mode) == 0o700
    for name in ("report.json", "report.html"):
        assert stat.S_IMODE(os.stat(os.path.join(run_dir, name)).st_mode) == 0o600


@pytest.fixture
def full_fs(tmp_path):
    """A real 64 KiB tmpfs (mount needs root, or CAP_SYS_ADMIN): the disk the report is written to fills up."""
    folder = tmp_path / "full"
    folder.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", str(folder)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({proc.stderr.strip() or 'mount failed'})")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def test_full_disk_report_goes_to_the_fallback_with_its_summary(full_fs, tmp_path):
    fill = ("import os, sys\n"
            f"path = os.path.join({str(full_fs)!r}, 'filler')\n"
            "with open(path, 'wb', buffering=0) as fh:\n"
            "    try:\n"
            "        while True: fh.write(b'x' * 4096)\n"
            "    except OSError as exc: print('full:', exc.strerror)\n")
    fallback_root = tmp_path / "tmp"
    fallback_root.mkdir()
    proc = run_rtkit(["run", "--out", str(full_fs), "--name", "fill", "--", sys.executable, "-c", fill],
                     env={"TMPDIR": str(fallback_root)})
    assert proc.returncode == 0, proc.stderr   # the job's own exit code, whatever happened to the report
    assert proc.stdout == "full: No space left on device\n"
    assert "Traceback" not in proc.stderr
    assert any(line.startswith("rtkit: ok (exit 0)") for line in proc.stderr.splitlines()), proc.stderr
    moved = [line for line in proc.stderr.splitlines() if "the report went to" in line]
    assert len(moved) == 1 and str(fallback_root) in moved[0] and "No space left on device" in moved[0], proc.stderr
    dirs = os.listdir(fallback_root)
    assert len(dirs) == 1, dirs
    report = load_report(fallback_root / dirs[0])
    assert report["run"]["status"] == "ok" and report["run"]["run_dir"] == str(fallback_root / dirs[0])
    # nothing half-written stays on the full disk
    left = [os.path.join(d, f) for d, _, files in os.walk(full_fs) for f in files if f != "filler"]
    assert not [f for f in left if ".tmp" in f or f.endswith("report.json")], left


def test_temporaries_of_a_refused_write_are_removed_finished_files_kept(tmp_path):
    from rtkit import rundir

    names = [".report.json.tmp-41-3", "allocator-7.json.tmp.7.2", "steps-7.json", "report.json", "notes.tmp"]
    for name in names:
        (tmp_path / name).write_text("x")
    assert sorted(rundir.remove_temporaries(str(tmp_path))) == [".report.json.tmp-41-3", "allocator-7.json.tmp.7.2"]
    assert sorted(os.listdir(tmp_path)) == ["notes.tmp", "report.json", "steps-7.json"]
