# test_cluster.py -- cluster mode without TensorFlow: task specs, task run directories, rtkit launch, merged reports.
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import time

import pytest

from conftest import RTKIT, load_report, run_rtkit, unpreloaded_env
from rtkit.cluster import merge, spec

PY = sys.executable
CLUSTER = {"ps": ["localhost:2222"], "worker": ["localhost:2223", "localhost:2224"]}

# A stand-in for a TF task: says who it is; a PS blocks forever (as TF's server.join() does).
FAKE_TASK = r"""
import json, os, sys, time
c = json.loads(os.environ["TF_CONFIG"]); role, i = c["task"]["type"], c["task"]["index"]
mode = sys.argv[1] if len(sys.argv) > 1 else ""
took = []
if mode == "usr1":   # a "checkpoint now" handler, set before the hello: a worker ends after it, a PS serves on
    import signal
    signal.signal(signal.SIGUSR1, lambda s, f: took.append(print(f"{role} {i} took SIGUSR1", flush=True)))
print(f"hello from {role} {i} tier_pool_path={os.environ.get('RTKIT_TIER_POOL_PATH', '')}", flush=True)
while mode == "usr1" and role != "ps" and not took:
    time.sleep(0.05)
if mode == "stubborn" and role == "ps":   # a PS slow to stop: still serving when the launcher's grace ends
    import signal
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    open(sys.argv[2], "w").write(str(os.getpid()))
up = os.environ.get("FAKE_PS_UP")   # as a TF worker waits for its PS: a worker goes on once every PS is up
if up and role == "ps":
    open(os.path.join(up, f"ps-{i}"), "w").close()
elif up:
    deadline = time.time() + 120
    while len(os.listdir(up)) < len(c["cluster"].get("ps", [])) and time.time() < deadline:
        time.sleep(0.02)
if role == "ps":
    if mode == "psdie":
        time.sleep(0.5); sys.exit(5)
    while True:
        time.sleep(0.05)
if mode == "psdie":
    while True:
        time.sleep(0.05)
if mode == "hang":
    while True:
        time.sleep(0.05)
if mode == "serve" and role == "worker":   # a TF2 PS-strategy worker: serves in Server.join() until stopped
    open(os.environ["RTKIT_LAUNCH_SERVING"], "w").close()
    while True:
        time.sleep(0.05)
if mode == "fail" and role == "worker" and i == 1:
    sys.exit(3)
if mode == "flaky" and role == "worker" and i == 1 and not os.path.exists(sys.argv[2]):
    open(sys.argv[2], "w").close()
    os.kill(os.getpid(), 9)
print(f"done {role} {i}", flush=True)
"""


def _tf_config(role, index, cluster=CLUSTER):
    return json.dumps({"cluster": cluster, "task": {"type": role, "index": index}})


# ------------------------------------------------------------------------------------------ spec

def test_tf_config_parsed():
    t = spec.from_tf_config(_tf_config("worker", 1))
    assert (t.role, t.index, t.address, t.is_chief, t.name) == ("worker", 1, "localhost:2224", False, "worker-1")
    assert spec.from_tf_config(_tf_config("worker", 0)).is_chief
    with_chief = dict(CLUSTER, chief=["localhost:2225"])
    assert not spec.from_tf_config(_tf_config("worker", 0, with_chief)).is_chief
    assert spec.from_tf_config(_tf_config("chief", 0, with_chief)).is_chief


@pytest.mark.parametrize("text, words", [
    ('{"cluster": {"ps": ["h:1"]}}', "no 'task' field"),
    ('{"task": {"type": "ps", "index": 0}}', "no 'cluster' field"),
    ('{"cluster": {"ps": ["h:1"]}, "task": {"type": "ps"}}', "no 'index' field"),
    ('{"cluster": {"ps": ["h:1"]}, "task": {"type": "boss", "index": 0}}', "unknown task type 'boss'"),
    ('{"cluster": {"ps": ["h:1"], "boss": ["h:2"]}, "task": {"type": "ps", "index": 0}}', "unknown role 'boss'"),
    ('{"cluster": {"ps": ["h:1"]}, "task": {"type": "ps", "index": 3}}', "ps:3 is not in the cluster"),
    ('{"cluster": {"ps": ["nohostport"]}, "task": {"type": "ps", "index": 0}}', "is not host:port"),
    ("{not json", "not valid JSON"),
])
def test_bad_tf_config_is_one_clear_error(text, words):
    with pytest.raises(spec.ClusterError) as exc:
        spec.from_tf_config(text)
    assert words in str(exc.value) and "\n" not in str(exc.value)


def test_classic_flags_both_spellings():
    t = spec.detect({}, ["python", "train.py", "--job_name=worker", "--task_index", "1",
                         "-ps_hosts=h:1", "--worker_hosts", "h:2,h:3"])
    assert (t.role, t.index, t.cluster, t.source) == ("worker", 1, {"ps": ["h:1"], "worker": ["h:2", "h:3"]}, "flags")
    assert spec.detect({}, ["python", "train.py", "--steps", "3"]) is None
    with pytest.raises(spec.ClusterError, match="--worker_hosts is missing"):
        spec.detect({}, ["train.py", "--job_name=ps", "--ps_hosts=h:1"])
    # TF_CONFIG wins over flags
    assert spec.detect({"TF_CONFIG": _tf_config("ps", 0)}, ["--job_name=worker"]).role == "ps"


# ---------------------------------------------------------------------------------- rtkit run

@pytest.mark.slow   # a whole local cluster of `rtkit run` processes
def test_run_dirs_carry_role_index_and_restarts(tmp_path):
    out = tmp_path / "shared"
    env = {"TF_CONFIG": _tf_config("worker", 1)}
    for _ in range(2):
        run_rtkit(["run", "--out", str(out), "--", PY, "-c", "print('x')"], env=env, check_rc=0)
    run_rtkit(["run", "--out", str(out), "--", PY, "-c", "pass"], env={"TF_CONFIG": _tf_config("ps", 0)},
              check_rc=0)
    assert sorted(os.listdir(out)) == ["ps-0", "worker-1", "worker-1.restart1"]
    rep = load_report(out / "worker-1.restart1")
    assert (rep["cluster"]["role"], rep["cluster"]["index"], rep["cluster"]["attempt"]) == ("worker", 1, 1)
    task = json.loads((out / "worker-1.restart1" / "task.json").read_text())
    assert task["role"] == "worker" and task["attempt"] == 1 and task["status"] == "ok"


def test_run_with_classic_flags(tmp_path):
    run_rtkit(["run", "--out", str(tmp_path), "--", PY, "-c", "pass", "--job_name=ps", "--task_index=0",
               "--ps_hosts=localhost:2222", "--worker_hosts=localhost:2223"], check_rc=0)
    assert os.listdir(tmp_path) == ["ps-0"]
    assert load_report(tmp_path / "ps-0")["cluster"]["source"] == "flags"


def test_run_bad_tf_config_exit_2_one_line_job_not_started(tmp_path):
    marker = tmp_path / "ran"
    proc = run_rtkit(["run", "--out", str(tmp_path / "o"), "--", PY, "-c", f"open({str(marker)!r}, 'w')"],
                     env={"TF_CONFIG": '{"cluster": {"ps": ["h:1"]}, "task": {"type": "boss", "index": 0}}'})
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "unknown task type 'boss'" in proc.stderr
    assert not marker.exists()


def test_run_port_taken_exit_2(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        cluster = {"ps": [f"localhost:{port}"], "worker": ["localhost:1"]}
        proc = run_rtkit(["run", "--out", str(tmp_path), "--", PY, "-c", "pass"],
                         env={"TF_CONFIG": _tf_config("ps", 0, cluster)})
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and f"port {port} is taken" in proc.stderr


# ------------------------------------------------------------------------------- rtkit launch

def _launch(tmp_path, *args, mode="", extra=(), timeout=180):
    script = tmp_path / "task.py"
    script.write_text(FAKE_TASK)
    folder = tmp_path / "c"
    up = tmp_path / "ps-up"
    up.mkdir()
    proc = run_rtkit(["launch", *args, "--cluster-dir", str(folder), "--", PY, str(script), mode, *extra],
                     env={"FAKE_PS_UP": str(up)}, timeout=timeout)
    return proc, folder


@pytest.mark.slow   # a whole local cluster of `rtkit run` processes
def test_launch_prefixes_output_stops_ps_and_merges(tmp_path):
    proc, folder = _launch(tmp_path, "--ps", "1", "--workers", "2", "--chief")
    assert proc.returncode == 0, proc.stderr
    for who in ("ps 0", "chief 0", "worker 0", "worker 1"):
        role, i = who.split()
        assert f"[{role}:{i}] hello from {who}" in proc.stdout
    assert "stopping the parameter servers" in proc.stderr
    assert sorted(os.listdir(folder)) == ["chief-0", "cluster.json", "ps-0", "worker-0", "worker-1"]
    m = merge.merge(str(folder))
    status = {r["task"]: r["status"] for r in m["tasks"]}
    assert status == {"chief-0": "ok", "worker-0": "ok", "worker-1": "ok", "ps-0": "stopped"}
    assert m["failures"] == [] and m["exit_code"] == 0
    text = run_rtkit(["report", str(folder)], check_rc=0).stdout
    assert "ps:0" in text and "stopped" in text and "worker:1" in text
    html = run_rtkit(["report", "--html", str(folder)], check_rc=0).stdout.strip()
    assert html.endswith("cluster-report.html") and "<svg" in open(html).read()
    cmp = run_rtkit(["compare", str(folder), str(folder)], check_rc=0).stdout
    assert "ps_peak_rss_bytes_max" in cmp


@pytest.mark.slow   # a whole local cluster of `rtkit run` processes
def test_launch_ends_a_ps_strategy_job_when_the_chief_is_done_and_workers_serve(tmp_path):
    """TF2 ParameterServerStrategy: workers block in Server.join() like the PS; the chief's end ends the job."""
    proc, folder = _launch(tmp_path, "--ps", "1", "--workers", "2", "--chief", mode="serve")
    assert proc.returncode == 0, proc.stderr
    assert "[chief:0] done chief 0" in proc.stdout
    assert "the remaining workers serve the coordinator's steps" in proc.stderr
    m = merge.merge(str(folder))
    status = {r["task"]: r["status"] for r in m["tasks"]}
    assert status == {"chief-0": "ok", "worker-0": "stopped", "worker-1": "stopped", "ps-0": "stopped"}
    assert m["failures"] == [] and m["exit_code"] == 0


@pytest.mark.slow   # a whole local cluster of `rtkit run` processes
def test_launch_collective_workers_get_tf_config_as_tfjob_writes_it(tmp_path):
    """MultiWorkerMirroredStrategy: --workers M alone; TF_CONFIG has no ps, tasks are worker 0..M-1 (and chief 0)."""
    proc, folder = _launch(tmp_path, "--workers", "2", "--chief")
    assert proc.returncode == 0, proc.stderr
    for who in ("chief 0", "worker 0", "worker 1"):
        role, i = who.split()
        assert f"[{role}:{i}] done {who}" in proc.stdout
    assert "parameter servers" not in proc.stderr
    assert sorted(os.listdir(folder)) == ["chief-0", "cluster.json", "worker-0", "worker-1"]
    cluster = json.loads((folder / "worker-1" / "report.json").read_text())["cluster"]
    assert set(cluster["cluster"]) == {"chief", "worker"} and len(cluster["cluster"]["worker"]) == 2
    assert (cluster["role"], cluster["index"], cluster["is_chief"]) == ("worker", 1, False)


def test_launch_picks_ports_below_the_ephemeral_range():
    """A port the kernel can hand to an outgoing connection may be taken before its task binds it."""
    from rtkit.cluster import launcher

    low, _ = launcher._ephemeral_range()
    ports = launcher.pick_ports(6)
    assert len(set(ports)) == 6
    if low > launcher.PORT_FLOOR + 100:
        assert all(p < low for p in ports), (ports, low)


@pytest.mark.slow   # a whole local cluster of `rtkit run` processes
def test_launch_ps_set_only_reaches_ps_tasks_expanded(tmp_path):
    pool = tmp_path / "pool-{task}"
    proc, folder = _launch(tmp_path, "--ps", "2", "--workers", "1", "--ps-set", f"tier_pool_path={pool}")
    assert proc.returncode == 0, proc.stderr
    assert f"[ps:1] hello from ps 1 tier_pool_path={tmp_path / 'pool-ps-1'}\n" in proc.stdout
    assert "[worker:0] hello from worker 0 tier_pool_path=\n" in proc.stdout


@pytest.mark.slow   # a whole local cluster of `rtkit run` processes
def test_launch_exits_with_failing_worker_code(tmp_path):
    proc, folder = _launch(tmp_path, "--ps", "1", "--workers", "2", mode="fail")
    assert proc.returncode == 3, proc.stderr
    assert "worker:1 failed with exit code 3" in proc.stderr
    m = merge.merge(str(folder))
    assert [f["task"] for f in m["failures"]] == ["worker-1"]


@pytest.mark.slow   # a whole local cluster of `rtkit run` processes
def test_launch_restarts_a_killed_worker(tmp_path):
    proc, folder = _launch(tmp_path, "--ps", "1", "--workers", "2", "--restart-failed", "1", mode="flaky",
                           extra=[str(tmp_path / "killed-once")])
    assert proc.returncode == 0, proc.stderr
    assert "worker:1 exited with code 137: restarting it (1 of 1)" in proc.stderr
    assert "[worker:1] done worker 1" in proc.stdout
    m = merge.merge(str(folder))
    runs = [(r["dir"], r["status"], r["signal"]) for r in m["tasks"] if r["task"] == "worker-1"]
    assert runs == [("worker-1", "killed", "SIGKILL"), ("worker-1.restart1", "ok", None)]
    assert m["restarts"] == {"worker-1": 1}
    text = run_rtkit(["report", str(folder)], check_rc=0).stdout
    assert "restart 1" in text and "failure: worker-1 (worker-1) killed, killed by SIGKILL" in text


def _no_core_and_default_stops():
    """In the child about to exec rtkit launch: SIGQUIT leaves no core; the stop signals are at their default action
    however pytest was started (a shell's background job ignores SIGINT and SIGQUIT, and the launcher keeps that)."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)


def _launch_signalled(tmp_path, sig, mode):
    """rtkit launch (1 PS, 2 workers in `mode`) sent `sig` once every task said hello: its exit code, output, folder."""
    script = tmp_path / "task.py"
    script.write_text(FAKE_TASK)
    folder = tmp_path / "c"
    proc = subprocess.Popen([RTKIT, "launch", "--ps", "1", "--workers", "2", "--cluster-dir", str(folder), "--",
                             PY, str(script), mode], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=_no_core_and_default_stops)
    try:
        seen, lines = set(), []
        deadline = time.time() + 120
        for line in proc.stdout:
            lines.append(line)
            if "hello from" in line:
                seen.add(line.split("]")[0])
            if len(seen) == 3 or time.time() > deadline:
                break
        proc.send_signal(sig)
        lines += proc.stdout.readlines()
        return proc.wait(timeout=60), "".join(lines), folder
    finally:
        _end_the_launch(proc, folder)


def _end_the_launch(proc, folder):
    """The launcher killed if it still runs, then every task that outlived it (by its `rtkit run`'s pid, whose tree
    guard ends the command)."""
    if proc.poll() is None:
        proc.kill()
    with open(folder / "cluster.json") as fh:
        started = [e["pid"] for e in json.load(fh)["events"] if e["event"] == "start"]
    for pid in filter(_running, started):
        os.kill(pid, signal.SIGKILL)


@pytest.mark.slow   # a whole local cluster of `rtkit run` processes
@pytest.mark.parametrize("name", ["SIGTERM", "SIGQUIT"])
def test_launch_forwards_a_stop_signal_to_every_task(tmp_path, name):
    sig = signal.Signals[name]
    code, out, folder = _launch_signalled(tmp_path, sig, "hang")
    assert code == 128 + sig, out
    m = merge.merge(str(folder))
    assert {r["task"]: r["signal"] for r in m["tasks"]} == {"ps-0": name, "worker-0": name, "worker-1": name}


# `rtkit launch` as ever, but for where SIGTERM comes: from the launcher itself, after the first task's start and before
# the second's (a signal from outside may land there or after the last start, as the machine's load has it)
STOPPED_WHILE_STARTING = r"""
import signal, sys
from rtkit import cli
from rtkit.cluster import launcher

class StoppedWhileStarting(launcher.Launch):
    def _start(self, task, attempt):
        if any(e["event"] == "start" for e in self.events) and not getattr(self, "stop_sent", False):
            self.stop_sent = True
            signal.raise_signal(signal.SIGTERM)   # its handler has run when this returns
        return super()._start(task, attempt)

launcher.Launch = StoppedWhileStarting
sys.exit(cli.main(sys.argv[1:]))
"""


def test_launch_forwards_a_stop_signal_that_came_while_tasks_started(tmp_path):
    """A SIGTERM that came while rtkit launch started its tasks reaches those started after it: no PS left waiting."""
    task, driver, folder = tmp_path / "task.py", tmp_path / "launch.py", tmp_path / "c"
    task.write_text(FAKE_TASK)
    driver.write_text(STOPPED_WHILE_STARTING)
    proc = subprocess.Popen([PY, str(driver), "launch", "--ps", "2", "--workers", "1", "--cluster-dir", str(folder),
                             "--", PY, str(task), "hang"], env=unpreloaded_env(), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=180)   # a hang guard, never the pass condition
    except subprocess.TimeoutExpired:
        pytest.fail("rtkit launch still waits for tasks that were started after the SIGTERM and never got it")
    finally:
        _end_the_launch(proc, folder)
    assert proc.returncode == 128 + signal.SIGTERM, out
    with open(folder / "cluster.json") as fh:
        exits = {e["task"]: e["exit_code"] for e in json.load(fh)["events"] if e["event"] == "exit"}
    assert exits == dict.fromkeys(("ps-0", "ps-1", "worker-0"), 128 + signal.SIGTERM), out   # each blocks until stopped


@pytest.mark.slow   # a whole local cluster of `rtkit run` processes
def test_launch_passes_sigusr1_on_to_every_task(tmp_path):
    """SIGUSR1 to rtkit launch (a batch system's "checkpoint now") reaches each task's handler; the job runs on (its
    default action would end the launcher alone, and leave every task running, orphaned)."""
    code, out, folder = _launch_signalled(tmp_path, signal.SIGUSR1, "usr1")
    assert code == 0, out
    for who in ("ps 0", "worker 0", "worker 1"):
        role, i = who.split()
        assert f"[{role}:{i}] {who} took SIGUSR1" in out
    m = merge.merge(str(folder))
    assert {r["task"]: r["status"] for r in m["tasks"]} == {"ps-0": "stopped", "worker-0": "ok", "worker-1": "ok"}


@pytest.mark.slow   # a whole local cluster of `rtkit run` processes
def test_launch_dead_ps_ends_job_naming_it(tmp_path):
    proc, folder = _launch(tmp_path, "--ps", "1", "--workers", "1", mode="psdie")
    assert proc.returncode == 5, proc.stderr
    assert "parameter server ps:0" in proc.stderr and "exited with code 5" in proc.stderr


@pytest.mark.slow   # a whole local cluster of `rtkit run` processes
def test_launch_output_nobody_reads_stops_no_task_and_keeps_the_exit_code(tmp_path):
    """`rtkit launch ... 2>&1 | head`, head gone: the tasks' lines and rtkit's are lost, the job is not (its end stops
    the PS as ever, with a report, and rtkit launch exits 0)."""
    import subprocess

    script = tmp_path / "task.py"
    script.write_text(FAKE_TASK)
    folder = tmp_path / "c"
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run([RTKIT, "launch", "--ps", "1", "--workers", "1", "--cluster-dir", str(folder), "--", PY,
                               str(script)], env=unpreloaded_env(), stdin=subprocess.DEVNULL, stdout=write_end,
                              stderr=write_end, timeout=180)
    finally:
        os.close(write_end)
    assert proc.returncode == 0
    m = merge.merge(str(folder))
    assert {r["task"]: r["status"] for r in m["tasks"]} == {"ps-0": "stopped", "worker-0": "ok"}


@pytest.mark.slow   # a whole local cluster of `rtkit run` processes
def test_launch_leaves_no_task_running_when_its_stop_takes_a_sigkill(tmp_path):
    """A PS that ignores SIGTERM: after the grace, the launcher's SIGKILL ends its `rtkit run`, whose tree guard then
    ends the PS itself (the command leads a process group of its own: a SIGKILL to the group of `rtkit run` killed the
    guard with it, and the PS ran on, orphaned)."""
    pid_file = tmp_path / "ps-pid"
    proc, folder = _launch(tmp_path, "--ps", "1", "--workers", "1", mode="stubborn", extra=[str(pid_file)])
    ps = int(pid_file.read_text())
    try:
        assert proc.returncode == 0, proc.stderr
        for _ in range(18000):   # 3 minutes: only a hang guard, never the pass condition
            if not _running(ps):
                break
            time.sleep(0.01)
        assert not _running(ps), "the PS outlived rtkit launch"
    finally:
        if _running(ps):
            os.kill(ps, 9)


def _running(pid):
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


@pytest.mark.parametrize("args, words", [
    (["--ps", "0", "--workers", "0"], "--workers must be at least 1 when --ps is 0"),
    (["--workers", "0", "--chief"], "--workers must be at least 1 when --ps is 0"),
    (["--ps", "1", "--workers", "0"], "--workers must be at least 1"),
    (["--ps", "1", "--workers", "1", "--ports", "1,x"], "expected comma-separated port numbers"),
    (["--ps", "1", "--workers", "1", "--ports", "40001"], "--ports lists 1 port(s), the cluster has 2"),
    (["--ps", "1000000", "--workers", "1"], "at most 256 tasks"),
    (["--ps", "200", "--workers", "57", "--chief"], "at most 256 tasks"),
    (["--ps", "1", "--workers", "1", "--ports", "99999,99998"], "--ports 99999: a port is 1 to 65535"),
    (["--ps", "1", "--workers", "1", "--ports", "0,40001"], "--ports 0: a port is 1 to 65535"),
    (["--ps", "1", "--workers", "1", "--ports", "40001,40001"], "--ports lists port 40001 twice"),
])
def test_launch_bad_spec_exit_2_one_line(tmp_path, args, words):
    proc = run_rtkit(["launch", *args, "--out", str(tmp_path), "--", PY, "-c", "pass"])
    assert proc.returncode == 2 and words in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not os.listdir(tmp_path)


def test_launch_port_taken_exit_2(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        proc = run_rtkit(["launch", "--ps", "1", "--workers", "1", "--ports", f"{port + 1 if port < 65000 else 1024},{port}",
                          "--out", str(tmp_path), "--", PY, "-c", "pass"])
    assert proc.returncode == 2 and f"port {port} is taken" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


# ------------------------------------------------------------------------------------- merge

def _fake_task_dir(folder, role, index, attempt=0, steps=10, step_ms=10.0, status="ok", peak_rss=1 << 20,
                   ps_tables=None):
    name = f"{role}-{index}" + (f".restart{attempt}" if attempt else "")
    d = folder / name
    d.mkdir(parents=True)
    rec = {"task_schema": 1, "role": role, "index": index, "attempt": attempt, "status": status,
           "exit_code": 0 if status == "ok" else 137, "signal": None if status == "ok" else "SIGKILL",
           "start_unix": 1000.0, "steps": steps, "step_ms_median": step_ms,
           "steps_per_s": 1000.0 / step_ms if step_ms else None, "peak_rss_bytes": peak_rss,
           "minor_faults_per_step": 3, "allocator_state": "planned",
           "steps_timeline": [[i * step_ms / 1000.0, i] for i in range(1, steps + 1)] if role != "ps" else [],
           "rss_timeline": [[0.0, 1 << 20]]}
    if ps_tables is not None:
        rec["ps_tables"] = ps_tables
    (d / "task.json").write_text(json.dumps(rec))


def _tables(**by_ps):
    """A chief's ps_tables record: ps index -> [(name, kind, bytes, estimate)]."""
    return {"ps_tables_schema": 1, "written_unix": 5.0, "source": "test", "note": None,
            "ps": {k[2:]: [{"name": n, "kind": kind, "bytes": b, "estimate": est} for n, kind, b, est in objs]
                   for k, objs in by_ps.items()}}


def test_merge_ps_memory_by_table_sums_and_share_of_rss(tmp_path):
    mib = 1 << 20
    old = _tables(ps0=[("emb", "variable", 1, False)])
    old["written_unix"] = 1.0     # an earlier chief run's record loses to the newer one
    _fake_task_dir(tmp_path, "worker", 0, status="killed", ps_tables=old)
    _fake_task_dir(tmp_path, "worker", 0, attempt=1, ps_tables=_tables(
        ps0=[("emb", "variable", 6 * mib, False), ("emb/Adagrad", "slot", 6 * mib, False),
             ("ids", "hash table", 4 * mib, True)],
        ps1=[("w", "variable", 2 * mib, False), ("shape_unknown", "variable", None, False)]))
    _fake_task_dir(tmp_path, "ps", 0, steps=0, step_ms=None, peak_rss=64 * mib)
    _fake_task_dir(tmp_path, "ps", 1, steps=0, step_ms=None, peak_rss=32 * mib)
    pm = merge.merge(str(tmp_path))["ps_memory"]["by_ps"]
    assert (pm["ps-0"]["tables_bytes"], pm["ps-0"]["estimated_bytes"], pm["ps-0"]["share_of_peak_rss"]) == \
        (16 * mib, 4 * mib, 0.25)
    assert (pm["ps-1"]["tables_bytes"], pm["ps-1"]["unknown"], pm["ps-1"]["share_of_peak_rss"]) == (2 * mib, 1, 0.0625)
    text = run_rtkit(["report", str(tmp_path)], check_rc=0).stdout
    assert "ps:0: 3 objects, 16.0 MiB in tables = 25.0% of its peak RSS 64.0 MiB, of which 4.00 MiB estimated" in text
    assert "1 object(s) of unknown size" in text and "hash table (estimate)" in text


def test_compare_two_cluster_folders(tmp_path):
    mib = 1 << 20
    a, b = tmp_path / "a", tmp_path / "b"
    for folder, ms, rss in ((a, 10.0, 100 * mib), (b, 20.0, 150 * mib)):
        _fake_task_dir(folder, "worker", 0, step_ms=ms, ps_tables=_tables(ps0=[("emb", "variable", 8 * mib, False)]))
        _fake_task_dir(folder, "worker", 1, step_ms=ms)
        _fake_task_dir(folder, "ps", 0, steps=0, step_ms=None, peak_rss=rss)
    _fake_task_dir(b, "worker", 1, attempt=1, step_ms=20.0)   # B's worker 1 ran twice
    rows = {r["figure"]: r for r in json.loads(run_rtkit(["compare", "--json", str(a), str(b)], check_rc=0).stdout)["rows"]}
    assert rows["step_ms_median_of_workers"]["ratio_b_over_a"] == 2.0
    assert rows["ps_peak_rss_bytes_max"]["ratio_b_over_a"] == 1.5
    assert rows["ps_tables_bytes_total"]["a"] == rows["ps_tables_bytes_total"]["b"] == 8 * mib
    assert (rows["training_steps"]["a"], rows["training_steps"]["b"]) == (20, 30)
    assert (rows["restarts"]["a"], rows["restarts"]["b"]) == (0, 1)
    text = run_rtkit(["compare", str(a), str(b)], check_rc=0).stdout
    assert "cluster A vs B" in text and "150 MiB" in text.replace(".0 MiB", " MiB")
    mixed = run_rtkit(["compare", str(a), str(a / "worker-0")])
    assert mixed.returncode == 2 and len(mixed.stderr.strip().splitlines()) == 1
    assert "is a cluster folder" in mixed.stderr


def test_merge_names_stragglers_and_restarts(tmp_path):
    for i, ms in enumerate([10.0, 10.5, 9.5, 20.0]):
        _fake_task_dir(tmp_path, "worker", i, step_ms=ms)
    _fake_task_dir(tmp_path, "worker", 4, step_ms=10.0, status="killed", steps=3)
    _fake_task_dir(tmp_path, "worker", 4, attempt=1, step_ms=10.0)
    _fake_task_dir(tmp_path, "ps", 0, steps=0, step_ms=None)
    assert merge.is_cluster_dir(str(tmp_path))
    m = merge.merge(str(tmp_path))
    assert [s["task"] for s in m["stragglers"]] == ["worker-3"]
    assert m["straggler_margin"] == 0.25
    assert m["restarts"] == {"worker-4": 1}
    assert m["training_steps"] == 4 * 10 + 3 + 10
    assert m["roles"] == {"worker": 5, "ps": 1}


def test_merge_tasks_the_launcher_stopped_are_not_failures(tmp_path):
    _fake_task_dir(tmp_path, "worker", 0, status="failed")
    _fake_task_dir(tmp_path, "ps", 0, steps=0, step_ms=None, status="interrupted")
    (tmp_path / "worker-1").mkdir()          # its `rtkit run` was stopped before it wrote anything
    events = [{"event": "stop", "task": "ps-0"}, {"event": "stop", "task": "worker-1"}]
    (tmp_path / "cluster.json").write_text(json.dumps({"events": events, "exit_code": 137}))
    m = merge.merge(str(tmp_path))
    assert {r["task"]: r["status"] for r in m["tasks"]} == {"worker-0": "failed", "worker-1": "stopped",
                                                           "ps-0": "stopped"}
    assert [f["task"] for f in m["failures"]] == ["worker-0"]


# A task that names itself and its pid, then runs until stopped (a PS's server.join(), a hung worker).
PID_TASK = r"""
import json, os, time
c = json.loads(os.environ["TF_CONFIG"])
print(f"pid {c['task']['type']}-{c['task']['index']} {os.getpid()}", flush=True)
while True:
    time.sleep(3600)
"""


@pytest.mark.slow   # a local cluster of `rtkit run` processes
@pytest.mark.timeout(300)   # a safety net only: each task's end is waited for by its pidfd, with no bound of our own
def test_kill_9_of_rtkit_launch_ends_its_tasks(tmp_path):
    """kill -9 of rtkit launch: each task's `rtkit run` dies with it, and its tree guard ends the command (they ran on,
    orphaned, serving forever)."""
    import select

    script = tmp_path / "task.py"
    script.write_text(PID_TASK)
    proc = subprocess.Popen([RTKIT, "launch", "--ps", "1", "--workers", "2", "--cluster-dir", str(tmp_path / "c"), "--",
                             PY, str(script)], env=unpreloaded_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    pidfds = {}
    try:
        for line in proc.stdout:   # each task's line, as the launcher streams it: the task runs and has said its pid
            if "] pid " in line:
                name, pid = line.split()[-2:]
                pidfds[name] = os.pidfd_open(int(pid))   # while it surely runs: never another process's pid
            if len(pidfds) == 3:
                break
        assert len(pidfds) == 3, "the launcher ended before every task said its pid"
        proc.kill()
        proc.wait()
        for name, fd in pidfds.items():
            poller = select.poll()
            poller.register(fd, select.POLLIN)   # readable once the process has ended
            assert poller.poll(), name
    finally:
        if proc.poll() is None:
            proc.kill()
        for fd in pidfds.values():
            try:
                signal.pidfd_send_signal(fd, signal.SIGKILL)   # a task the launcher's death left running
            except ProcessLookupError:
                pass
            os.close(fd)
