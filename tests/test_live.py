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

from conftest import RTKIT, requires_tf, run_rtkit, unpreloaded_env

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
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=unpreloaded_env(),
                                     start_new_session=True)

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
    # each per-step list is cut to its latest records (live.records_cut says how many it lost), numbered as in the run
    steps = [s["step"] for s in live["steps"]["per_step"]]
    assert steps == list(range(steps[0], steps[0] + len(steps))) and len(steps) <= 50, steps
    assert steps[0] == 1 + live["live"]["records_cut"].get("steps.per_step", 0), (steps[0], live["live"]["records_cut"])
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


def _scrape(port):
    """{metric name: [(labels, value)]} from the endpoint, parsed with prometheus_client's OpenMetrics parser."""
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics",
                                 headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            text = resp.read().decode()
    except OSError:
        return None
    return {f.name: [(s.labels, s.value) for s in f.samples] for f in text_string_to_metric_families(text)}


@requires_tf
def test_prometheus_scrape_during_the_run(job):
    live = _until(lambda: job.stepped(20), "20 steps in live.json", job.proc)
    got = _until(lambda: (lambda m: m if m and m.get("rtkit_steps") and m["rtkit_steps"][0][1] >= 20 else None)(
        _scrape(job.port)), "a scrape with 20 steps", job.proc)
    labels, running = got["rtkit_running"][0]
    assert running == 1.0 and labels == {"run": live["run"]["name"], "role": "", "index": ""}
    for name in ("rtkit_live_step_ms_median", "rtkit_live_steps_per_s", "rtkit_rss_now_bytes", "rtkit_hit_rate"):
        assert got[name][0][1] > 0, name
    assert got["rtkit_allocator_state"][0][0]["state"] in ("profiling", "planned")


def test_metrics_task_ports_follow_the_launch_port_order():
    from rtkit.cluster.spec import Task
    from rtkit.live.metrics import task_port

    cluster = {"chief": ["h:1"], "worker": ["h:2", "h:3"], "ps": ["h:4", "h:5"]}
    ports = [task_port(9400, Task(role, i, cluster, "launch")) for role in ("chief", "worker", "ps")
             for i in range(len(cluster[role]))]
    assert ports == [9400, 9401, 9402, 9403, 9404]


@requires_tf
def test_report_after_the_end_keeps_the_snapshots_cost(finished):
    job, report = finished
    assert not os.path.exists(os.path.join(job.run_dir, "live.json"))
    live = report["live"]
    assert live["snapshots"] > 0 and live["snapshot_ms_median"] > 0 and 0 < live["share_of_interval"]
    assert 0 < live["snapshot_cpu_ms_median"] and 0 < live["cpu_share_of_interval"]
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


def _tb_scalars(folder):
    """{tag: {step: value}} of every scalar in `folder`, read back with TensorBoard's own reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    acc = EventAccumulator(folder, size_guidance={"tensors": 0, "scalars": 0})
    acc.Reload()
    out = {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}
    for tag in acc.Tags()["tensors"]:
        out[tag] = {e.step: float(tensor_util.make_ndarray(e.tensor_proto)) for e in acc.Tensors(tag)}
    return out


@requires_tf
def test_tensorboard_scalars_are_the_reports_steps(finished):
    import numpy as np

    job, report = finished
    got = _tb_scalars(os.path.join(job.tb, "rtkit"))
    per = report["steps"]["per_step"]
    assert per and len(per) == report["steps"]["count"]
    for tag, key in (("rtkit/step_ms", "step_ms"), ("rtkit/rss_bytes", "rss_bytes"),
                     ("rtkit/minor_faults", "minor_faults")):
        # no script summaries in the folder: rtkit's step index; values as TensorBoard stores them (float32)
        assert got[tag] == {s["step"]: float(np.float32(s[key])) for s in per}, tag
    plan_at = report["allocator"]["plan"]["made_at_step"]
    in_use = got["rtkit/allocator/plan_in_use"]
    # the allocator's steps at the training steps they are: the plan serves from its step plan_at on
    from rtkit.report import glossary as G

    first_planned = G.training_step(report, plan_at)
    assert first_planned == report["steps"]["first_told_step"] + plan_at
    assert in_use and all(v == (1.0 if k >= first_planned else 0.0) for k, v in in_use.items())
    hits = got["rtkit/allocator/arena_hits"]
    assert min(k for k, v in hits.items() if v > 0) == first_planned
    assert max(got["rtkit/process/major_faults"].values()) <= report["process"]["major_faults"]


SCRIPT_WITH_SUMMARIES = """
import sys
import tensorflow as tf
tf.compat.v1.disable_eager_execution()
step = tf.compat.v1.train.get_or_create_global_step()
x = tf.Variable(3.0)
loss = x * x
train = tf.compat.v1.train.GradientDescentOptimizer(0.01).minimize(loss, global_step=step)
summary = tf.compat.v1.summary.scalar("loss", loss)
with tf.control_dependencies([train]):
    after = tf.identity(step.read_value())   # the global step once this step's update is done
with tf.compat.v1.Session() as sess:
    sess.run(tf.compat.v1.global_variables_initializer())
    sess.run(step.assign(1000))          # as if restored from a checkpoint at step 1000
    writer = tf.compat.v1.summary.FileWriter(sys.argv[1])
    for _ in range(40):
        _, s, g = sess.run([train, summary, after])
        writer.add_summary(s, g)
    writer.close()
"""


@requires_tf
def test_tensorboard_steps_follow_the_scripts_global_step(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT_WITH_SUMMARIES)
    tb = str(tmp_path / "tb")
    run_dir = str(tmp_path / "run")
    run_rtkit(["run", "--run-dir", run_dir, "--tensorboard", tb, "--set", "live_interval_ms=300", "--",
               sys.executable, str(script), os.path.join(tb, "train")], check_rc=0)
    loss_steps = sorted(_tb_scalars(os.path.join(tb, "train"))["loss"])
    ours = _tb_scalars(os.path.join(tb, "rtkit"))["rtkit/step_ms"]
    with open(os.path.join(run_dir, "report.json")) as fh:
        report = json.load(fh)
    assert report["steps"]["count"] == 40 and loss_steps == list(range(1001, 1041))
    # rtkit's figures of each step sit at the step of the loss the script wrote after it
    assert sorted(ours) == loss_steps


def test_exporters_that_cannot_start_say_one_line_and_the_job_runs(tmp_path):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    try:
        proc = run_rtkit(["run", "--run-dir", str(tmp_path / "run"), "--tensorboard", str(not_a_dir / "tb"),
                          "--metrics-port", str(port), "--", sys.executable, "-c", "print('job ran')"])
    finally:
        taken.close()
    assert proc.returncode == 0 and proc.stdout == "job ran\n"
    # one line each when the job starts (the end-of-run summary repeats the report's notes)
    tb_lines = [line for line in proc.stderr.splitlines() if line.startswith("rtkit: tensorboard_dir")]
    port_lines = [line for line in proc.stderr.splitlines() if line.startswith(f"rtkit: metrics_port {port}:")]
    assert len(tb_lines) == 1 and len(port_lines) == 1, proc.stderr


def test_top_on_a_cluster_folder_is_one_line_per_task(tmp_path):
    folder = tmp_path / "job-cluster"
    for task in ("worker-0", "worker-1", "ps-0"):
        run_rtkit(["run", "--quiet", "--run-dir", str(folder / task), "--", sys.executable, "-c", "pass"], check_rc=0)
    out = run_rtkit(["top", str(folder), "--once"], check_rc=0).stdout.splitlines()
    assert "3 task run(s)" in out[0]
    rows = {line.split()[0]: line.split() for line in out[2:] if line.strip()}
    assert set(rows) == {"task", "worker-0", "worker-1", "ps-0"}
    assert all(rows[t][1] == "ok" for t in ("worker-0", "worker-1", "ps-0"))
    assert rows["task"][:3] == ["task", "state", "steps"]


@requires_tf
def test_launch_tasks_serve_their_own_labelled_endpoints(tmp_path):
    base = _free_port()
    folder, tb = tmp_path / "cluster", tmp_path / "tb"
    env = unpreloaded_env()
    with open(tmp_path / "launch.log", "w") as log:
        launcher = subprocess.Popen(
            [RTKIT, "launch", "--ps", "1", "--workers", "1", "--cluster-dir", str(folder),
             "--set", f"metrics_port={base}", "--set", f"tensorboard_dir={tb}", "--", sys.executable, "-m",
             "rtkit.workloads", "wdl", "--steps", "1000000", "--batch", "256", "--rows", "4096", "--capacity", "4096",
             "--data-dir", str(tmp_path / "data"), "--checkpoint-dir", str(tmp_path / "ckpt"), "--no-progress"],
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            # no chief: worker 0 first, then the parameter server (the order of `rtkit launch --ports`)
            worker = _until(lambda: (lambda m: m if m and m.get("rtkit_steps") and m["rtkit_steps"][0][1] >= 1
                                     else None)(_scrape(base)), "worker 0's endpoint with a step", launcher)
            assert worker["rtkit_running"][0][0] == {"run": "rtkit.workloads", "role": "worker", "index": "0"}
            ps = _until(lambda: _scrape(base + 1), "ps 0's endpoint", launcher)
            assert ps["rtkit_running"][0][0]["role"] == "ps" and ps["rtkit_running"][0][0]["index"] == "0"
            view = run_rtkit(["top", str(folder), "--once"], check_rc=0).stdout
            rows = {line.split()[0]: line.split()[1] for line in view.splitlines()[2:] if line.strip()}
            assert rows.get("worker-0") == "running" and rows.get("ps-0") == "running", view
        finally:   # the job trains until stopped: what is checked is seen while it runs
            if launcher.poll() is None:
                launcher.send_signal(signal.SIGTERM)
            code = launcher.wait()
    assert code == 128 + signal.SIGTERM
    assert sorted(os.listdir(tb)) == ["rtkit-ps-0", "rtkit-worker-0"]


def _report_with_allocator_steps(first, last, count):
    """A report as a snapshot gives it: `count` training steps, the allocator's latest records first..last."""
    per = [{"step": i, "t_s": 0.1 * i, "step_ms": 1.0, "minor_faults": 0, "rss_bytes": 1} for i in range(1, count + 1)]
    return {"run": {}, "live": {"start_unix": 1e9},
            "steps": {"signature": "s", "count": count, "per_step": per, "first_told_step": 2},
            "allocator": {"plan": {"made_at_step": 3},
                          "per_step": [{"step": k, "arena_hits": k, "fallbacks": 0} for k in range(first, last + 1)]}}


def test_tensorboard_keeps_writing_allocator_steps_when_the_allocator_keeps_only_its_latest(tmp_path):
    from rtkit.live.tensorboard import TensorBoardExporter

    tb = TensorBoardExporter(str(tmp_path / "tb"))
    tb.update(_report_with_allocator_steps(0, 9, 12))
    tb.update(_report_with_allocator_steps(5, 14, 17))   # a list of 10 at most: the oldest records dropped
    tb.writer.close()
    hits = _tb_scalars(os.path.join(str(tmp_path / "tb"), "rtkit"))["rtkit/allocator/arena_hits"]
    # every allocator step once, at the training step it is (the step that first told it + k)
    assert hits == {2 + k: float(k) for k in range(0, 15)}


def test_snapshot_cost_is_a_share_of_the_time_actually_left_between_snapshots(tmp_path):
    from rtkit.live.snapshot import BUDGET, Live

    live = Live([], {"live_interval_ms": 2000}, str(tmp_path), {}, {}, [], lambda *a: {})
    # a long job: each snapshot took 80 ms of CPU, so the loop left 80 ms / BUDGET between them, not 2 s
    live.costs_ms, live.cpu_costs_ms = [90.0] * 3, [80.0] * 3
    live.waits_s = [2.0] + [0.08 / BUDGET] * 3
    cost = live.cost()
    assert cost["interval_s"] == 2.0 and cost["interval_s_median"] == 4.0
    assert cost["cpu_share_of_interval"] == BUDGET


def test_metrics_help_says_so_far_while_running_and_whole_run_after():
    pytest.importorskip("prometheus_client")
    from rtkit.live.metrics import _Collector
    from rtkit.report.contract import Allocator as A

    def help_of(status):
        c = _Collector({"run": "r"})
        c.report = {"run": {"name": "r", "status": status}, "allocator": {A.HIT_RATE: 0.5}}
        return {m.name: m.documentation for m in c.collect()}["rtkit_hit_rate"]

    assert "so far" in help_of("running") and "whole run" not in help_of("running")
    assert "whole run" in help_of("ok")
