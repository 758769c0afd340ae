# test_cluster_tf.py -- real TF parameter-server clusters on localhost: wdl under `rtkit launch`, a worker killed and restarted.
import json
import os
import re
import signal
import subprocess
import sys

import psutil
import pytest

from conftest import RTKIT, load_report, requires_tf
from rtkit.cluster import merge, render

pytestmark = requires_tf
PY = sys.executable
SMALL = ["--batch", "256", "--rows", "20000", "--emb-dim", "8", "--capacity", "16384", "--no-progress",
         "--threads-inter", "2", "--threads-intra", "1"]


def _printed_steps(output):
    """{(role, index): [steps printed by each run of that task]} from the workers' summary lines."""
    found = {}
    for m in re.finditer(r"^\[(\w+):(\d+)\] rtkit-workload: .* steps=(\d+) ", output, re.M):
        found.setdefault(f"{m.group(1)}-{m.group(2)}", []).append(int(m.group(3)))
    return found


# the checkpoint's own record of every variable and hash table (read by TF in a child: the test process
# never imports TensorFlow): {name: bytes} for variables and slots, {table: entries} for hash tables
_CKPT_SIZES = """
import json, sys, tensorflow as tf
path = tf.train.latest_checkpoint(sys.argv[1])
out = {"variables": {}, "tables": {}, "global_step": int(tf.train.load_variable(path, "global_step"))}
for name, shape in tf.train.list_variables(path):
    if name.endswith("-keys"):
        out["tables"][name[:-len("-keys")]] = int(shape[0])
    elif not name.endswith("-values"):
        out["variables"][name] = int(tf.train.load_variable(path, name).nbytes)
print(json.dumps(out))
"""


def _checkpoint_sizes(ckpt_dir):
    proc = subprocess.run([PY, "-c", _CKPT_SIZES, str(ckpt_dir)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _check_ps_tables(m, expected):
    """The merged report's ps:0 breakdown against the checkpoint the chief wrote at its end."""
    ps0 = m["ps_memory"]["by_ps"]["ps-0"]
    objs = {o["name"]: o for o in ps0["tables"]}
    variables = {n: o["bytes"] for n, o in objs.items() if o["kind"] in ("variable", "slot")}
    assert variables == expected["variables"]   # every variable and slot (one PS holds them all), exact bytes
    assert objs["C1/embedding/Adagrad"]["kind"] == "slot" and objs["C1/embedding/Adagrad"]["of"] == "C1/embedding"
    tables = {n: o for n, o in objs.items() if o["kind"] == "hash table"}
    assert set(tables) == set(expected["tables"]) and len(tables) == 26   # one id -> row map per feature
    for name, o in tables.items():
        # int64 -> int64; the other worker may still add ids between the chief's last save and its close
        assert o["estimate"] and o["entry_bytes"] == 16 and o["bytes"] == o["entries"] * 16
        assert o["entries"] >= expected["tables"][name]
    assert sum(o["entries"] for o in tables.values()) > 0
    assert ps0["tables_bytes"] == sum(o["bytes"] for o in objs.values())
    assert ps0["estimated_bytes"] == sum(o["bytes"] for o in tables.values())
    assert ps0["share_of_peak_rss"] == round(ps0["tables_bytes"] / ps0["peak_rss_bytes"], 4)


def test_one_ps_two_workers_train_wdl_and_report_matches(tmp_path, data_dir):
    folder = tmp_path / "c"
    proc = subprocess.run([RTKIT, "launch", "--ps", "1", "--workers", "2", "--cluster-dir", str(folder),
                           "--examples-per-step", "256", "--ps-set", f"tier_pool_path={tmp_path}/pool-{{task}}", "--", PY, "-m", "rtkit.workloads", "wdl", "--steps", "30",
                           "--data-dir", data_dir, "--checkpoint-dir", str(tmp_path / "ckpt"), *SMALL],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    printed = _printed_steps(proc.stdout)
    assert printed == {"worker-0": [30], "worker-1": [30]}, proc.stdout[-3000:]
    m = merge.merge(str(folder))
    merged = {r["task"]: r["steps"] for r in m["tasks"] if r["role"] == "worker"}
    assert merged == {"worker-0": 30, "worker-1": 30}
    ps = [r for r in m["tasks"] if r["role"] == "ps"]
    assert ps[0]["status"] == "stopped" and ps[0]["peak_rss_bytes"] > 0
    # the PS's step signal: advances of the global step (60 worker updates), seen from the PS process
    assert 0 < ps[0]["steps"] <= 60 and ps[0]["examples_per_s"] is None
    # tier mode on the PS only: the tables made at the chief's initialisation went to the PS's own pool
    assert ps[0]["tier_peak_bytes"] > 1 << 20   # (the pool file itself is unlinked once created)
    assert all(r["tier_peak_bytes"] is None for r in m["tasks"] if r["role"] == "worker")
    ps_steps = json.loads(next((folder / "ps-0").glob("steps-*.json")).read_text())
    assert ps_steps["signature"] == "ps: global_step advanced"
    assert m["cluster_examples_per_s"] and m["cluster_examples_per_s"] > 0
    assert any(n.startswith("model.ckpt-") for n in os.listdir(tmp_path / "ckpt"))   # the chief saved
    rep = json.loads((folder / "worker-1" / "report.json").read_text())
    assert rep["cluster"]["role"] == "worker" and rep["cluster"]["index"] == 1
    # each PS's memory by table, from the chief's graph, against the checkpoint's own sizes
    _check_ps_tables(m, _checkpoint_sizes(tmp_path / "ckpt"))
    text = render.render_text(m)   # (`rtkit report` on a cluster folder prints this; tests/test_cluster.py runs it)
    assert "ps:0 memory by table" in text and "estimated (hash tables)" in text and "of its peak RSS" in text
    assert "C9/ev/id_to_row" in render.render_html(m)   # the HTML lists every object


def test_killed_worker_is_restarted_rejoins_and_report_shows_it(tmp_path, data_dir):
    folder = tmp_path / "c"
    launcher = subprocess.Popen(
        [RTKIT, "launch", "--ps", "1", "--workers", "2", "--restart-failed", "1", "--cluster-dir", str(folder),
         "--", PY, "-m", "rtkit.workloads", "wdl", "--steps", "40", "--print-losses", "--data-dir", data_dir,
         *SMALL], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines, killed = [], None
    try:
        for line in launcher.stdout:
            lines.append(line)
            if killed is None and line.startswith("[worker:1] loss 3 "):
                killed = _kill_task(launcher.pid, "worker", 1)
        rc = launcher.wait(timeout=600)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    out = "".join(lines)
    assert killed, out[-3000:]
    assert rc == 0, out[-3000:]
    assert "worker:1 exited with code 137: restarting it (1 of 1)" in out
    printed = _printed_steps(out)
    assert printed == {"worker-0": [40], "worker-1": [40]}, out[-3000:]   # the killed run printed no summary
    m = merge.merge(str(folder))
    # the killed run keeps only the steps its recorder had flushed (every few seconds), so no count for it
    runs = [(r["dir"], r["status"], r["signal"], r["steps"]) for r in m["tasks"] if r["task"] == "worker-1"]
    assert runs[0][:3] == ("worker-1", "killed", "SIGKILL")
    assert runs[1] == ("worker-1.restart1", "ok", None, 40)
    assert m["restarts"] == {"worker-1": 1}


def _kill_task(launcher_pid, role, index):
    """SIGKILL the training script of task role:index (not its `rtkit run`); its pid, or None."""
    for child in psutil.Process(launcher_pid).children(recursive=True):
        try:
            if (child.cmdline()[1:3] == ["-m", "rtkit.workloads"]
                    and f'"type":"{role}","index":{index}' in child.environ().get("TF_CONFIG", "")):
                os.kill(child.pid, signal.SIGKILL)
                return child.pid
        except psutil.Error:
            continue
    return None


def _saved_step(ckpt_dir):
    """The global step of the newest checkpoint named in the `checkpoint` state file, 0 when none."""
    try:
        text = (ckpt_dir / "checkpoint").read_text()
    except OSError:
        return 0
    m = re.search(r'^model_checkpoint_path: ".*model\.ckpt-(\d+)"', text, re.M)
    return int(m.group(1)) if m else 0


def test_killed_ps_ends_job_with_its_name_and_restart_resumes_from_checkpoint(tmp_path, data_dir):
    ckpt = tmp_path / "ckpt"
    job = ["--", PY, "-m", "rtkit.workloads", "wdl", "--data-dir", data_dir, "--checkpoint-dir", str(ckpt),
           "--checkpoint-steps", "3", *SMALL]
    launcher = subprocess.Popen([RTKIT, "launch", "--ps", "1", "--workers", "1", "--cluster-dir", str(tmp_path / "a"),
                                 *job, "--steps", "100000", "--print-losses"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines, killed = [], None
    try:
        for line in launcher.stdout:
            lines.append(line)
            # a few steps after the first checkpoint past step 0 (the one the saver writes at start)
            if killed is None and line.startswith("[worker:0] loss ") and _saved_step(ckpt) >= 3:
                killed = _kill_task(launcher.pid, "ps", 0)
                saved = _saved_step(ckpt)
        rc = launcher.wait(timeout=300)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    out = "".join(lines)
    assert killed, out[-3000:]
    assert rc == 137, out[-3000:]
    named = [ln for ln in lines if ln.startswith("rtkit launch: parameter server ps:0 (localhost:")]
    assert len(named) == 1 and "exited with code 137" in named[0] and "checkpoint" in named[0], out[-3000:]
    saved = max(saved, _saved_step(ckpt))   # the saver may have finished one more while the kill landed
    assert saved >= 3
    # the same job again with the same checkpoint folder: the chief restores it and trains 5 more steps
    again = subprocess.run([RTKIT, "launch", "--ps", "1", "--workers", "1", "--cluster-dir", str(tmp_path / "b"),
                            *job, "--steps", "5"], capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    m = re.search(r"^\[worker:0\] rtkit-workload: .* steps=(\d+) global_step=(\d+) ", again.stdout, re.M)
    assert m, again.stdout[-3000:]
    assert (int(m.group(1)), int(m.group(2))) == (5, saved + 5)   # resumed from the saved step, not from 0


# A TF2 parameter-server job as TensorFlow's "Parameter server training" tutorial writes it (not the bundled one).
USER_PSS = r"""
import sys
import tensorflow as tf

resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
if resolver.task_type in ("worker", "ps"):
    tf.distribute.Server(resolver.cluster_spec(), job_name=resolver.task_type, task_index=resolver.task_id,
                         protocol="grpc", start=True).join()
strategy = tf.distribute.ParameterServerStrategy(resolver)
coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
with strategy.scope():
    emb = tf.Variable(tf.random.stateless_uniform([5000, 8], seed=[1, 2]))
    w = tf.Variable(tf.random.stateless_uniform([8, 1], seed=[3, 4]))
    opt = tf.keras.optimizers.Adagrad(0.1)

def dataset_fn():
    ids = tf.random.stateless_uniform([4096], seed=[5, 6], maxval=5000, dtype=tf.int64)
    return tf.data.Dataset.from_tensor_slices(ids).repeat().batch(128).map(lambda x: (x, tf.cast(x % 2, tf.float32)))

it = iter(coordinator.create_per_worker_dataset(dataset_fn))

@tf.function
def step(iterator):
    def fn(ids, y):
        with tf.GradientTape() as tape:
            logit = tf.squeeze(tf.matmul(tf.gather(emb, ids), w), 1)
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=y, logits=logit))
        opt.apply_gradients(zip(tape.gradient(loss, [emb, w]), [emb, w]))
        return loss
    return strategy.run(fn, args=next(iterator))

calls = 0
for epoch in range(int(sys.argv[1])):
    for _ in range(int(sys.argv[2])):
        rv = coordinator.schedule(step, args=(it,))
        calls += 1
    coordinator.join()
print("scheduled", calls, "loss", float(rv.fetch()))
"""


def _task_steps(folder):
    return {r["task"]: r for r in merge.merge(str(folder))["tasks"]}


def test_user_ps_strategy_job_trains_under_launch_with_steps_counted_on_the_coordinator(tmp_path):
    script = tmp_path / "pss_train.py"
    script.write_text(USER_PSS)
    folder = tmp_path / "c"
    proc = subprocess.run([RTKIT, "launch", "--ps", "1", "--workers", "2", "--chief", "--cluster-dir", str(folder),
                           "--", PY, str(script), "3", "40"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "[chief:0] scheduled 120 loss" in proc.stdout
    m = merge.merge(str(folder))
    rows = {r["task"]: r for r in m["tasks"]}
    assert rows["chief-0"]["steps"] == 120            # every schedule() is one step, exactly
    assert m["training_steps"] == 120                 # the serving workers' steps are not counted twice
    chief = load_report(folder / "chief-0")
    assert chief["steps"]["api"] == "ClusterCoordinator.schedule"
    assert chief["steps"]["signature"] == "ClusterCoordinator.schedule(step)"
    for name in ("worker-0", "worker-1", "ps-0"):
        assert rows[name]["status"] == "stopped" and not rows[name]["trains"]
        assert rows[name]["steps"] > 0                # they follow the coordinator's step clock
    assert rows["ps-0"]["allocator_state"] == "planned"   # a PS plans as in the TF1 path
    ps_notes = " ".join(load_report(folder / "ps-0")["notes"])
    assert "global_step" not in ps_notes                  # the clock, not the TF1 poll, gave its steps
    assert "serving: worker:0, worker:1 ran the coordinator's steps" in render.render_text(m)


def test_bundled_wdl_pss_variant_trains_and_every_task_plans(tmp_path, data_dir):
    folder = tmp_path / "c"
    proc = subprocess.run([RTKIT, "launch", "--ps", "1", "--workers", "2", "--chief", "--cluster-dir", str(folder),
                           "--", PY, "-m", "rtkit.workloads", "wdl", "--api", "pss", "--steps", "80",
                           "--data-dir", data_dir, "--batch", "256", "--rows", "20000", "--emb-dim", "8",
                           "--no-progress"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if "rtkit-workload: model=wdl api=pss" in x)
    assert "steps=80 " in line
    rows = _task_steps(folder)
    assert rows["chief-0"]["steps"] == 80
    assert {rows[n]["allocator_state"] for n in ("chief-0", "worker-0", "worker-1", "ps-0")} == {"planned"}


# A MultiWorkerMirroredStrategy custom loop as TensorFlow's multi-worker tutorial writes it.
USER_MWMS = r"""
import json, os
import tensorflow as tf

strategy = tf.distribute.MultiWorkerMirroredStrategy()
task = json.loads(os.environ["TF_CONFIG"])["task"]
with strategy.scope():
    w = tf.Variable(tf.ones([4, 1]))
    opt = tf.keras.optimizers.SGD(0.01)

@tf.function
def step(x):
    def fn(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.matmul(x, w) ** 2)
        opt.apply_gradients([(tape.gradient(loss, w), w)])
        return loss
    return strategy.reduce("MEAN", strategy.run(fn, args=(x,)), axis=None)

x = tf.ones([8, 4])
for _ in range(10):
    loss = step(x)
print("done", task["type"], task["index"], strategy.num_replicas_in_sync, float(loss))
"""


def test_multi_worker_mirrored_job_under_launch_workers_only(tmp_path):
    script = tmp_path / "mwms.py"
    script.write_text(USER_MWMS)
    folder = tmp_path / "c"
    proc = subprocess.run([RTKIT, "launch", "--workers", "2", "--cluster-dir", str(folder), "--", PY, str(script)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    done = sorted(x.split("] ", 1)[1].split()[:4] for x in proc.stdout.splitlines() if "] done " in x)
    assert done == [["done", "worker", "0", "2"], ["done", "worker", "1", "2"]]   # 2 replicas: they met
    rows = _task_steps(folder)
    assert {n: r["status"] for n, r in rows.items()} == {"worker-0": "ok", "worker-1": "ok"}
