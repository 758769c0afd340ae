# ps_steps.py -- a step signal for parameter servers: the cluster's global step, read from inside the PS process.
"""A PS never calls Session.run, so rtkit's session hooks see no step there and the allocator never leaves
its first phase. Chosen signal: the global step. The PS process opens its own session on its own
``tf.distribute.Server`` and reads the ``global_step`` resource variable (by its shared name, on each PS
task in turn until one holds it); each poll that finds it advanced ends one PS step
(``rtkit_step_mark()`` via the step recorder, as a manual step).

Why the global step and not the RPC tensors' rhythm: every worker update bumps it exactly once, it
exists in every ``MonitoredTrainingSession``/``minimize(global_step=...)`` script, and it needs no access
to gRPC internals. What it cannot give: with async workers a poll sees several updates at once (a PS
step is "all updates since the last poll"); a script without a global step gets no PS steps.

Why the poll adapts: one read is a whole master-session run (about 0.8 ms of CPU when this PS holds the
variable, about 2 ms spread over both PS processes when it is on another PS). Polled every 20 ms, two
PS took 2-10 ms of CPU per training step, 2-10% of a 2-worker cluster's CPU (docs/cluster.md, "What rtkit
costs a cluster"). So the period adapts, between
POLL_MIN_S and POLL_MAX_S, to see about as many updates per poll as the cluster has training tasks: a
PS step is about one step of each worker, and the reads cost a bounded share of the training's CPU at
any step rate. While the variable does not exist yet (before the chief's initialisation), or does not
move, the period doubles up to POLL_MAX_S; the read that first finds it returns to POLL_MIN_S.
"""
from __future__ import annotations

import os
import threading
import time

POLL_MIN_S = 0.02
POLL_MAX_S = 1.0
FLUSH_S = 1.0
_started = False
# set when another step signal proved right for this PS (a TF2 coordinator's step clock): TF2 jobs have no
# global_step, and each failed read makes TensorFlow log an error line
_superseded = threading.Event()


NOTE_PREFIX = "parameter server: a step is an advance of the cluster's global_step"


def stop_polling(rec) -> None:
    """Another step signal holds for this PS: stop reading global_step, and drop the note that said it would."""
    _superseded.set()
    with rec.lock:
        rec.notes[:] = [n for n in rec.notes if not n.startswith(NOTE_PREFIX)]


class PollStats:
    """What the poll did, for the PS report's note (and the test that bounds the reads per update)."""

    def __init__(self):
        self.reads = 0       # session runs made, failed ones included
        self.updates = 0     # global-step advances seen in all
        self.steps = 0       # PS steps recorded


stats = PollStats()


def next_interval(interval: float, advanced, target: int) -> float:
    """The poll's next period after one that saw `advanced` updates (None: the variable was not readable).
    Aims at `target` updates per poll; changes by at most 2x per poll, so a burst or a pause does not swing it."""
    if not advanced or advanced <= 0:
        return min(interval * 2.0, POLL_MAX_S)
    factor = min(max(target / advanced, 0.5), 2.0)
    return min(max(interval * factor, POLL_MIN_S), POLL_MAX_S)


def _poll(tf, server, ps_tasks: int, target: int, rec) -> None:
    from rtkit.hooks import session as session_timing
    from rtkit.hooks.steps import minor_faults

    graph = tf.Graph()
    with graph.as_default():
        reads = []
        for k in range(ps_tasks):
            with tf.compat.v1.device(f"/job:ps/task:{k}"):
                handle = tf.raw_ops.VarHandleOp(dtype=tf.int64, shape=[], container="", shared_name="global_step")
                reads.append(tf.raw_ops.ReadVariableOp(resource=handle, dtype=tf.int64))
    config = tf.compat.v1.ConfigProto(device_filters=["/job:ps"])
    last, last_unix, last_t, last_faults = None, time.time(), time.perf_counter(), minor_faults()
    found, flushed_t, interval = None, last_t, POLL_MIN_S
    with session_timing.internal():   # these reads are not steps of the session hooks
        sess = tf.compat.v1.Session(server.target, graph=graph, config=config)
        while not _superseded.is_set():
            candidates = [found] if found is not None else range(ps_tasks)
            value = None
            for k in candidates:
                stats.reads += 1
                try:
                    value = int(sess.run(reads[k]))
                    found = k
                    break
                except Exception:   # not created yet (the chief has not initialised), or on another PS
                    continue
            advanced = value - last if value is not None and last is not None else None
            if advanced is not None and advanced > 0:
                now_unix, now, faults = time.time(), time.perf_counter(), minor_faults()
                rec.record("manual", "ps: global_step advanced", last_unix, (now - last_t) * 1000.0, faults - last_faults)
                last_unix, last_t, last_faults = now_unix, now, faults
                stats.updates += advanced
                stats.steps += 1
            if value is not None:
                last = value
            if last_t > flushed_t and time.perf_counter() - flushed_t > FLUSH_S:
                # a PS ends by SIGTERM while blocked in join(): no atexit flush, so keep the file current
                rec.flush()
                flushed_t = time.perf_counter()
            # the first read that finds the variable returns to the fast pace (the period backed off while it was
            # absent): the next reads measure the rate from there
            first_find = value is not None and advanced is None
            interval = POLL_MIN_S if first_find else next_interval(interval, advanced, target)
            time.sleep(interval)


def install(tf) -> None:
    """In a PS task under rtkit, start the poller once its tf.distribute.Server exists."""
    global _started
    import sys

    from rtkit.cluster import spec

    try:
        task = spec.detect(os.environ, sys.argv)
    except spec.ClusterError:
        return
    if task is None or task.role != "ps":
        return
    from rtkit.hooks.steps import recorder

    rec = recorder()
    server_cls = tf.distribute.Server
    orig_init = server_cls.__init__

    def __init__(self, *args, **kwargs):
        global _started
        orig_init(self, *args, **kwargs)
        if _started:
            return
        _started = True
        ps_tasks = len(task.cluster.get("ps", []))
        target = max(1, len(task.cluster.get("chief", [])) + len(task.cluster.get("worker", [])))
        threading.Thread(target=_poll, args=(tf, self, ps_tasks, target, rec), daemon=True,
                         name="rtkit-ps-steps").start()
        rec.notes.append(f"{NOTE_PREFIX}, read from this process every {POLL_MIN_S * 1000:.0f}-"
                         f"{POLL_MAX_S * 1000:.0f} ms, adapted to see about "
                         f"{target} update(s) (one per training task) per read")

    server_cls.__init__ = __init__
