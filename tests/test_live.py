# test_live.py -- a running job seen from outside: live.json, `rtkit report` and `rtkit top` (in tmux), exporters.
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from conftest import RTKIT, requires_tf, run_rtkit

POLL_S = 0.5
GUARD_POLLS = 1200   # a hang guard (10 minutes of polls), never a bound on how fast anything is


def _until(cond, what, proc=None):
    """Poll cond() until it returns something true; fail (not hang) if the job ends first or the guard runs out."""
    for _ in range(GUARD_POLLS):
        got = cond()
        if got:
            return got
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"the job ended (exit {proc.returncode}) before {what}")
        time.sleep(POLL_S)
    pytest.fail(f"gave up waiting for {what}")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _live(run_dir):
    try:
        with open(os.path.join(run_dir, "live.json")) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


class Job:
    def __init__(self, root):
        self.run_dir = os.path.join(root, "run")
        self.tb = os.path.join(root, "tb")
        self.port = _free_port()
        self.log = open(os.path.join(root, "rtkit.log"), "w")
        cmd = [RTKIT, "run", "--run-dir", self.run_dir, "--tensorboard", self.tb, "--metrics-port", str(self.port),
               "--set", "live_interval_ms=500", "--", sys.executable, "-m", "rtkit.workloads", "wdl",
               "--steps", "1000000", "--batch", "256", "--rows", "4096", "--capacity", "4096",
               "--data-dir", os.path.join(root, "data"), "--no-progress"]
        env = dict(os.environ)
        env.pop("LD_PRELOAD", None)
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def stepped(self, n):
        live = _live(self.run_dir)
        return live if live and live["steps"]["count"] >= n else None

    def stop(self):
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)   # rtkit run forwards it and still writes the report
        self.proc.wait()
        self.log.close()


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    j = Job(str(tmp_path_factory.mktemp("live")))
    yield j
    j.stop()


@pytest.fixture(scope="module")
def finished(job):
    """The same job, stopped with SIGTERM once the tests that watch it running are done."""
    job.stop()
    with open(os.path.join(job.run_dir, "report.json")) as fh:
        return job, json.load(fh)


@requires_tf
def test_snapshot_is_the_report_marked_running(job):
    live = _until(lambda: job.stepped(20), "20 steps in live.json", job.proc)
    assert live["run"]["status"] == "running" and live["run"]["exit_code"] is None
    assert live["live"]["as_of"] and live["live"]["window"]["steps"] > 0
    # built by the report model: the same sections a finished report has
    for section in ("run", "process", "steps", "allocator", "bounds"):
        assert isinstance(live.get(section), dict), section
    assert [s["step"] for s in live["steps"]["per_step"]][:3] == [1, 2, 3]
    out = run_rtkit(["report", job.run_dir], check_rc=0).stdout.splitlines()
    assert out[0].startswith("rtkit: running, as of ")
    assert any(line.split() == ["status", "running"] for line in out)


@requires_tf
def test_top_in_a_real_terminal_refreshes_and_quits_with_q(job, tmp_path):
    _until(lambda: job.stepped(1), "a first step in live.json", job.proc)
    session = f"rtkit-top-{os.getpid()}"
    exit_file = str(tmp_path / "top-exit")
    shell = f"{RTKIT} top {job.run_dir} --interval 0.5; echo $? > {exit_file}"
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "120", "-y", "40", shell], check=True)
    try:
        def screen():
            return subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True,
                                  text=True).stdout

        first = _until(lambda: (lambda s: s if "running, as of" in s and " ms" in s else None)(screen()),
                       "rtkit top's first frame")
        assert "median step time, last window" in first and "allocator state" in first
        stamp = next(line for line in first.splitlines() if "running, as of" in line)
        # the view redraws by itself: a later frame is of a later snapshot
        _until(lambda: (lambda s: "running, as of" in s and stamp not in s)(screen()), "a refreshed frame")
        subprocess.run(["tmux", "send-keys", "-t", session, "q"], check=True)
        code = _until(lambda: open(exit_file).read().strip() if os.path.exists(exit_file) else None,
                      "rtkit top to exit after q")
        assert code == "0"
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)


@requires_tf
def test_report_after_the_end_keeps_the_snapshots_cost(finished):
    job, report = finished
    assert not os.path.exists(os.path.join(job.run_dir, "live.json"))
    live = report["live"]
    assert live["snapshots"] > 0 and live["snapshot_ms_median"] > 0 and 0 < live["share_of_interval"]
    assert live["window"]["steps"] > 0


def _bad(tmp_path, content):
    d = tmp_path / "run"
    d.mkdir()
    if content is not None:
        (d / "live.json").write_text(content)
    else:
        (d / "notes.txt").write_text("not a run")
    return str(d)


@pytest.mark.parametrize("command", ["report", "top"])
@pytest.mark.parametrize("content", [None, '{"run": {"status": "runn', '[1, 2]'])
def test_not_a_run_or_a_broken_snapshot_is_one_line_and_exit_2(tmp_path, command, content):
    run_dir = _bad(tmp_path, content)
    proc = run_rtkit([command, run_dir])
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and run_dir in lines[0], proc.stderr
