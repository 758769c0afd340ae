# test_hardening.py -- hostile inputs: planted links, bounded inputs, who reserves arenas, kept pools, limits, one-line errors, signals.
import glob
import io
import json
import os
import random
import signal
import stat
import struct
import subprocess
import sys
import time
from contextlib import redirect_stderr, redirect_stdout

import pytest

from conftest import REPO, RTKIT, load_report, preload_env as _env, run_rtkit

pytestmark = pytest.mark.timeout(300)
SHM = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None


def _steps(native, run_dir, extra=None, args=("4", "1M"), timeout=30, umask=None):
    env = _env(native, {"RTKIT_RUN_DIR": str(run_dir), **(extra or {})})
    return subprocess.run([os.path.join(native, "tests", "prmalloc_steps"), *args], env=env, capture_output=True,
                          timeout=timeout, preexec_fn=(lambda: os.umask(umask)) if umask is not None else None)


def _alloc_docs(run_dir):
    return [json.load(open(f)) for f in glob.glob(os.path.join(str(run_dir), "allocator-*.json"))]


def _plan_text(classes):
    """A plan file with a correct fingerprint (the fingerprint is FNV-1a over size, blocks, align)."""
    h = 1469598103934665603
    for c in classes:
        for b in struct.pack("<QQQ", *c):
            h = ((h ^ b) * 1099511628211) & (2**64 - 1)
    text = ("rtkit-malloc-plan 1\nspacing exact\nmin_size 32768\nreserved_bytes 0\n"
            f"fingerprint {h:016x}\nclasses {len(classes)}\n")
    return text + "".join(f"class {s} {b} {a}\n" for s, b, a in classes) + "end\n"


# ---- 1. writes never follow a planted link; modes honour the umask; run directories

def test_c_writes_never_follow_planted_links(prm, tmp_path):
    run_dir, victim = tmp_path / "shared", tmp_path / "victim.txt"
    run_dir.mkdir()
    victim.write_text("precious\n")
    last = int(open("/proc/sys/kernel/ns_last_pid").read())
    for pid in range(last + 1, last + 400):  # the next pids, under the old and the new temporary names
        for name in (f"allocator-{pid}.json.tmp.{pid}", f"allocator-{pid}.json.tmp.{pid}.1",
                     f"malloc-plan.txt.tmp.{pid}", f"malloc-plan.txt.tmp.{pid}.1"):
            os.symlink(victim, run_dir / name)
    proc = _steps(prm, run_dir, {"RTKIT_MALLOC_PROFILE_START": "0", "RTKIT_MALLOC_PROFILE_STABLE": "2"},
                  args=("6", "1M"))
    assert proc.returncode == 0, proc.stderr
    assert victim.read_text() == "precious\n"
    docs = _alloc_docs(run_dir)
    assert docs and docs[0]["steps"] == 6


def test_c_files_honour_the_umask(prm, tmp_path):
    proc = _steps(prm, tmp_path, umask=0o077)
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


# ---- 2. plans: bounded, regular files only, never blocking; the cost checked once

def test_fifo_plan_never_blocks(prm, tmp_path):
    fifo = tmp_path / "plan.fifo"
    os.mkfifo(fifo)
    proc = _steps(prm, tmp_path, {"RTKIT_MALLOC_PLAN": str(fifo)}, timeout=20)
    assert proc.returncode == 0
    (doc,) = _alloc_docs(tmp_path)
    assert "not a regular file" in doc["plan"]["rejected_reason"]
    assert proc.stderr.decode().count("\n") == 1 and "RTKIT_MALLOC_PLAN" in proc.stderr.decode()


def test_crafted_huge_plan_is_rejected_at_once(prm, tmp_path):
    plan = tmp_path / "huge.txt"
    plan.write_text(_plan_text([(256, 4294967295, 64)]))
    t0 = time.monotonic()
    proc = _steps(prm, tmp_path, {"RTKIT_MALLOC_PLAN": str(plan)}, timeout=20)
    assert proc.returncode == 0 and time.monotonic() - t0 < 10
    (doc,) = _alloc_docs(tmp_path)
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


# ---- 3. only the process that marks steps reserves arenas

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


# ---- 4. an existing pool at the tier path is never deleted

def test_tier_keeps_an_existing_durable_pool(prm, pmem_build, tmp_path, monkeypatch):
    native_dir = prm
    monkeypatch.setenv("RTKIT_LIB_DIR", pmem_build)
    from rtkit.allocators import pmem
    pmem._load()
    path = str(tmp_path / "durable.pool")
    with pmem.Pool.create(path, 4 << 20, segment_size=64 << 10, rebalance_ms=0) as pool:
        h = pool.alloc(1000)
        pool.buffer(h, 1000)[:] = b"d" * 1000
    before = open(path, "rb").read()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    proc = subprocess.run([os.path.join(prm, "tests", "prmalloc_tier"), "plain"],
                          env=_env(prm, {"RTKIT_RUN_DIR": str(run_dir), "RTKIT_TIER_POOL_PATH": path}),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert open(path, "rb").read() == before
    assert len([ln for ln in proc.stderr.splitlines() if "RTKIT_TIER_POOL_PATH" in ln]) == 1


# ---- 6. Python and C agree on limits; a fallback names its source

@pytest.mark.parametrize("value", ["99999999999G", "18446744073709551616", "18446744073709551615", "16", "15", "64K",
                                   "\u0661\u0662K", "64\u2003K"])
def test_python_and_c_agree_on_size_limits(prm, tmp_path, value):
    from rtkit import config as cfg
    try:
        cfg.BY_KEY["malloc_min_size"].parse(value)
        python_ok = True
    except ValueError:
        python_ok = False
    proc = _steps(prm, tmp_path, {"RTKIT_MALLOC_MIN_SIZE": value})
    assert proc.returncode == 0
    (doc,) = _alloc_docs(tmp_path)
    c_ok = not any("RTKIT_MALLOC_MIN_SIZE" in e for e in doc["errors"])
    assert python_ok == c_ok and doc["state"] != "disabled"


def test_out_of_range_set_falls_back_with_its_source(tmp_path):
    run_dir = tmp_path / "r"
    proc = run_rtkit(["run", "--run-dir", str(run_dir), "--set", "malloc_min_size=99999999999G", "--",
                      sys.executable, "-c", "pass"], timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("rtkit: --set RTKIT_MALLOC_MIN_SIZE")]
    assert len(lines) == 1 and "--set" in lines[0] and "environment" not in proc.stderr, proc.stderr
    report = load_report(run_dir)
    assert any("99999999999G" in n for n in report["notes"])
    assert report["run"]["settings"]["malloc_min_size"]["value"] == 32 * 1024
    prof = tmp_path / "p.toml"
    prof.write_text('[settings]\nmalloc_min_size = "99999999999G"\n')
    proc = run_rtkit(["config", "--profile", str(prof)])
    assert proc.returncode == 0 and "profile" in proc.stderr and "p.toml" in proc.stderr


# ---- 7. bad input on every CLI path: one line, exit 2

def _cli(argv):
    """rtkit's entry point in this process: (exit code, stdout, stderr); a traceback fails the test."""
    from rtkit import cli
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            rc = cli.main(argv)
        except SystemExit as exc:  # argparse's own usage errors
            rc = exc.code if isinstance(exc.code, int) else 2
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture
def bad_inputs(tmp_path):
    d = tmp_path
    (d / "latin1.toml").write_bytes(b'description = "caf\xe9"\n[settings]\n')
    deep = d / "deep"
    deep.mkdir()
    (deep / "report.json").write_text("[" * 100_000 + "]" * 100_000)
    bigint = d / "bigint"
    bigint.mkdir()
    (bigint / "report.json").write_text('{"run": {}, "x": ' + "9" * 5000 + "}")
    os.mkfifo(d / "fifo")
    (d / "junk.pool").write_bytes(os.urandom(8192))
    return d


def test_cli_bad_input_is_one_line(bad_inputs, monkeypatch):
    d = bad_inputs
    cases = [
        ["config", "--profile", str(d / "latin1.toml")],
        ["pmem", "create", str(d / "a.pool"), "--size", "99999999999G"],
        ["pmem", "create", str(d / "b.pool"), "--size", str(2**64)],
        ["pmem", "create", str(d / "c.pool"), "--size", "8M", "--max-record", "99999999999"],
        ["report", str(d / "deep")],
        ["report", str(d / "bigint")],
        ["report", str(d / "fifo")],
        ["pmem", "check", str(d / "fifo")],
        ["pmem", "info", str(d / "junk.pool")],
    ]
    for argv in cases:
        rc, out, err = _cli(argv)
        assert rc == 2, (argv, rc, err)
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, (argv, err)
    monkeypatch.setenv("RTKIT_PROFILE_PATH", str(d))
    rc, out, err = _cli(["config", "--profiles"])
    assert rc == 0 and "latin1" in out and "not UTF-8" in out


def test_html_report_of_a_non_utf8_command(tmp_path):
    run_dir = tmp_path / "r"
    arg = os.fsdecode(b"caf\xe9")
    proc = subprocess.run([RTKIT, "run", "--run-dir", str(run_dir), "--set", "malloc=0", "--", "true", arg],
                          capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    proc = subprocess.run([RTKIT, "report", "--html", str(run_dir)], capture_output=True, timeout=60)
    assert proc.returncode == 0 and b"Traceback" not in proc.stderr, proc.stderr
    assert os.path.getsize(run_dir / "report.html") > 0


def test_cli_fuzz(bad_inputs):
    """Random argv over the entry points that take files and numbers (fixed seed, bounded count): every case
    exits 0, 1 or 2 with no traceback."""
    rng = random.Random(10)
    d = bad_inputs
    paths = [str(d / n) for n in ("latin1.toml", "deep", "bigint", "fifo", "junk.pool", "nothing", "")] + \
        [os.fsdecode(b"\xff\xfe"), "/proc/self/mem", "/dev/null", str(d)]
    numbers = ["0", "-1", "1", "64K", "99999999999G", str(2**64), str(2**64 - 1), "1e9", "nan", "8M", "١٢"]
    shapes = [
        lambda: ["report", rng.choice(paths)] + rng.choice([[], ["--json"], ["--html"], ["--html", str(d / "o.html")]]),
        lambda: ["compare", rng.choice(paths), rng.choice(paths)],
        lambda: ["pmem", rng.choice(["check", "info"]), rng.choice(paths)] + rng.choice([[], ["--json"]]),
        lambda: ["pmem", "create", str(d / f"f{rng.randrange(10**6)}.pool"), "--size", rng.choice(numbers),
                 "--segment-size", rng.choice(numbers), "--block-size", rng.choice(numbers)],
        lambda: ["config", "--profile", rng.choice(paths)],
        lambda: ["config", "--set", f"{rng.choice(['malloc_min_size', 'tier_pool_size', 'warmup_steps', 'nope'])}="
                 f"{rng.choice(numbers)}"],
    ]
    seen = 0
    for _ in range(120):
        argv = rng.choice(shapes)()
        rc, out, err = _cli(argv)
        assert rc in (0, 1, 2), (argv, rc, err)
        assert "Traceback" not in err and "Traceback" not in out, (argv, err)
        if rc:
            assert err.strip(), (argv, "a failure says why")
        seen += 1
    assert seen == 120
    for f in glob.glob(str(d / "f*.pool")):
        os.unlink(f)


# ---- 8. bad plan input still gives a valid allocator file

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
    (doc,) = _alloc_docs(tmp_path)  # json.load succeeds
    assert doc["state"] != "off" and doc["plan"]["rejected_reason"]
    assert doc["config"]["malloc_plan"].endswith("plan-\ufffd.txt")


# ---- 9. signals reach the whole tree; leftovers are noted

def _sleepers(tag):
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")[:2] == [b"sleep", tag.encode()]:
                found.append(int(pid))
        except OSError:
            pass
    return found


def test_sigterm_reaches_the_process_group(tmp_path):
    tag = "41.25"
    proc = subprocess.Popen([RTKIT, "run", "--run-dir", str(tmp_path / "r"), "--set", "malloc=0", "--",
                             "sh", "-c", f"sleep {tag} & sleep {tag} & wait"], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        for _ in range(100):
            if len(_sleepers(tag)) >= 2:
                break
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        time.sleep(0.3)
        assert _sleepers(tag) == []
    finally:
        for pid in _sleepers(tag):
            os.kill(pid, signal.SIGKILL)


def test_leftover_descendants_are_noted(tmp_path):
    tag = "3.375"
    try:
        proc = run_rtkit(["run", "--run-dir", str(tmp_path / "r"), "--set", "malloc=0", "--", "sh", "-c",
                          f"sleep {tag} & exit 0"], timeout=60)
        assert proc.returncode == 0, proc.stderr
        notes = load_report(tmp_path / "r")["notes"]
        assert any("still running" in n and "sleep" in n for n in notes), notes
    finally:
        for pid in _sleepers(tag):
            os.kill(pid, signal.SIGKILL)


# ---- 10. small things

def test_pmem_small_things(pmem_build, tmp_path, monkeypatch):
    native_dir = pmem_build
    monkeypatch.setenv("RTKIT_LIB_DIR", native_dir)
    from rtkit.allocators import pmem
    pmem._load()
    path = str(tmp_path / "s.pool")
    with pmem.Pool.create(path, 4 << 20, segment_size=64 << 10, rebalance_ms=0) as pool:
        for n in (100, 200, 300, 150_000):
            pool.alloc(n)
        with pytest.raises(pmem.PoolBusyError) as err:
            pmem.Pool.open(path)
        assert "this process" in str(err.value)
    env = {"RTKIT_LIB_DIR": native_dir}
    info = json.loads(run_rtkit(["pmem", "info", "--json", path], env=env, check_rc=0).stdout)
    check = json.loads(run_rtkit(["pmem", "check", "--json", path], env=env, check_rc=0).stdout)
    assert info["records_allocated"] == check["records_allocated"] == 4
    junk = tmp_path / "j.pool"
    junk.write_bytes(b"x" * 8192)
    proc = run_rtkit(["pmem", "check", str(junk)], env=env)
    assert proc.returncode == 2 and proc.stderr.count(str(junk)) == 1, proc.stderr


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
