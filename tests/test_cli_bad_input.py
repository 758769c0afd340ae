# test_cli_bad_input.py -- bad input on every CLI path is one line and exit 2, never a traceback.
import glob
import io
import json
import os
import random
import subprocess
from contextlib import redirect_stderr, redirect_stdout

import pytest

from conftest import RTKIT

pytestmark = pytest.mark.timeout(300)


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
