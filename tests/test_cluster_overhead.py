# test_cluster_overhead.py -- rtkit's own work per unit of training stays bounded: counted reads, not timings.
"""Two costs measured on a local 2-PS/2-worker cluster (docs/cluster.md, "What rtkit costs a cluster"):
`rtkit run`'s sampler listed the child's descendants (a scan of every /proc entry on the machine) at every
sample, and the PS step signal read the global step every 20 ms whatever the training's pace. Both are
counted here with the real code: descendant listings per sample, global-step reads per update."""
import os
import subprocess
import sys
import textwrap
import time

from conftest import requires_tf

from rtkit import launch


def _children(pid):
    """The pids whose parent is `pid`, from /proc (not through launch, whose listings the test counts)."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as fh:
                    raw = fh.read()
            except OSError:
                continue
            if int(raw[raw.rfind(b")") + 2:].split()[1]) == pid:
                out.append(int(name))
    return out


def test_sampler_lists_descendants_seldom_and_still_finds_new_ones(monkeypatch):
    monkeypatch.setattr(launch, "DESCENDANTS_EVERY_S", 0.5)   # the test's own pace; the default is 2 s
    calls = []
    real = launch._descendants
    monkeypatch.setattr(launch, "_descendants", lambda pid: calls.append(pid) or real(pid))
    # a child that starts a grandchild after 0.3 s: it must be sampled within one listing period
    child = subprocess.Popen([sys.executable, "-c", "import subprocess, time; time.sleep(0.3); "
                              "p = subprocess.Popen(['sleep', '120']); time.sleep(120)"])
    try:
        sampler = launch.Sampler(child.pid, time.time(), 0.05)
        t0 = time.monotonic()
        sampler.sample_once()
        # however slow the child's start on a busy machine: sample until the grandchild exists, then two
        # listing periods more (it is found by the first listing after its start)
        seen, t_end = None, t0 + 60.0
        while time.monotonic() < t_end:
            time.sleep(0.02)
            sampler.sample_once()
            if seen is None and _children(child.pid):
                seen = time.monotonic()
                t_end = seen + 2 * launch.DESCENDANTS_EVERY_S
        elapsed = time.monotonic() - t0
    finally:
        for pid in real(child.pid)[1:]:
            os.kill(pid, 9)
        child.kill()
        child.wait()
    assert seen is not None, "the child never started its grandchild"
    n = len(sampler.samples)
    assert n >= 20
    # one listing (all of /proc) per DESCENDANTS_EVERY_S, not one per sample
    assert len(calls) <= elapsed / launch.DESCENDANTS_EVERY_S + 1, (len(calls), n, elapsed)
    assert sampler.samples[0]["processes"] == 1
    assert sampler.samples[-1]["processes"] == 2     # the grandchild, found by a later listing


def test_sampler_samples_a_reused_pid_as_the_new_process():
    """A listed pid whose start time changed belongs to another process now (the old one exited and the kernel
    gave its pid to a new descendant): the next listing must take the new start time and sample it. The earlier
    start time is put in the sampler's map by hand: a real pid reuse cannot be arranged without root."""
    child = subprocess.Popen(["sleep", "30"])
    try:
        sampler = launch.Sampler(child.pid, time.time(), 0.05)
        sampler.sample_once()
        assert sampler.samples and sampler.samples[-1]["processes"] == 1
        started = sampler._pids[child.pid]
        assert started == launch.start_ticks(child.pid)
        sampler._pids = {child.pid: started - 100}       # what a listing recorded for the pid's earlier owner
        sampler._listed = float("-inf")                   # the next sample lists again
        sampler.samples.clear()
        sampler.sample_once()
    finally:
        child.kill()
        child.wait()
    assert sampler._pids == {child.pid: started}
    assert sampler.samples and sampler.samples[-1]["processes"] == 1


_PS_SCRIPT = textwrap.dedent(r'''
    import json, os, socket, sys, threading, time

    def port():
        s = socket.socket(); s.bind(("localhost", 0)); p = s.getsockname()[1]; s.close(); return p

    ps = f"localhost:{port()}"
    # a PS of a cluster with 4 training tasks (never started: the poll only talks to the PS job)
    os.environ["TF_CONFIG"] = json.dumps({"cluster": {"ps": [ps], "worker": [f"localhost:{port()}" for _ in range(4)]},
                                          "task": {"type": "ps", "index": 0}})
    import tensorflow as tf
    from tensorflow.python.client import session as session_module
    from rtkit.hooks import ps_steps
    from rtkit.hooks.steps import recorder

    reads = []   # every session run of the poll thread, counted at TF's own entry point: (start, found it)
    orig_run = session_module.BaseSession.run

    def counting_run(self, *args, **kwargs):
        if threading.current_thread().name != "rtkit-ps-steps":
            return orig_run(self, *args, **kwargs)
        t = time.monotonic()
        try:
            out = orig_run(self, *args, **kwargs)
        except BaseException:
            reads.append((t, False))
            raise
        reads.append((t, True))
        return out

    session_module.BaseSession.run = counting_run
    # the poll's chosen periods, as it asks for them: what the pace is, whatever the machine's load makes of it
    periods = []   # (reads made before this sleep, seconds asked for)
    real_sleep = time.sleep

    def recording_sleep(seconds):
        if threading.current_thread().name == "rtkit-ps-steps":
            periods.append((len(reads), seconds))
        real_sleep(seconds)

    time.sleep = recording_sleep
    ps_steps.install(tf)
    server = tf.distribute.Server(tf.train.ClusterSpec(json.loads(os.environ["TF_CONFIG"])["cluster"]),
                                  job_name="ps", task_index=0)
    time.sleep(2.0)                      # no global step yet: the chief has not initialised
    absent_reads = len(reads)
    graph = tf.Graph()
    with graph.as_default():
        with tf.compat.v1.device("/job:ps/task:0"):
            gs = tf.compat.v1.train.get_or_create_global_step()
            bump = gs.assign_add(1)
        sess = tf.compat.v1.Session(server.target, config=tf.compat.v1.ConfigProto(device_filters=["/job:ps"]))
        sess.run(tf.compat.v1.global_variables_initializer())
        while not any(ok for _, ok in reads):
            time.sleep(0.05)             # the poll finds it
        first = len(reads)
        for updates in range(1, 121):    # a fixed amount of training, ~50 updates/s as a few workers make them
            sess.run(bump)
            time.sleep(0.02)
        time.sleep(0.3)
    steps = recorder().sources["manual"].get("ps: global_step advanced")
    found = [i for i, (_, ok) in enumerate(reads) if ok][0]
    print(json.dumps({"absent_reads": absent_reads, "training_reads": len(reads) - first, "updates": updates,
                      "ps_steps": steps.count if steps else 0, "poll_min_s": ps_steps.POLL_MIN_S,
                      "poll_max_s": ps_steps.POLL_MAX_S,
                      # the periods asked for after each read up to the one that found the variable, and after it
                      "periods_before_find": [p for n, p in periods if n <= found],
                      "period_after_find": [p for n, p in periods if n == found + 1][0]}))
''')


@requires_tf
def test_ps_step_signal_reads_global_step_about_once_per_round_of_workers(tmp_path):
    script = tmp_path / "ps_poll.py"
    script.write_text(_PS_SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RTKIT_") and k != "TF_CONFIG"}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = __import__("json").loads(out.stdout.strip().splitlines()[-1])
    assert got["updates"] == 120, got
    # a read every 20 ms, found or not, would make ~90 reads while absent and ~1 per update while training: the
    # period backs off while the variable is absent and aims at 4 updates (4 training tasks) per read
    assert got["absent_reads"] <= 12, got
    # while absent each period doubles (up to the cap); the read that finds the variable returns to the fast
    # pace, so the rate measurement starts there and not at the backed-off period. The periods are the ones the
    # poll asked for, counted per read: a loaded machine stretches the sleeps, never the choice.
    before, lo, hi = got["periods_before_find"], got["poll_min_s"], got["poll_max_s"]
    assert len(before) >= 2 and before == [min(lo * 2 ** (i + 1), hi) for i in range(len(before))], got
    assert got["period_after_find"] == lo, got
    assert got["training_reads"] <= got["updates"] / 2, got
    # the step marks keep coming: about one PS step per 4 updates, never fewer than one per 16
    assert got["ps_steps"] >= got["updates"] / 16, got
