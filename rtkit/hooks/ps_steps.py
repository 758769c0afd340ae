# ps_steps.py -- a step signal for parameter servers: the cluster's global step, read from inside the PS process.
"""A PS never calls Session.run, so rtkit's session hooks see no step there and the allocator never leaves
its first phase. Chosen signal: the global step. The PS process opens its own session on its own
``tf.distribute.Server`` and reads the ``global_step`` resource variable (by its shared name, on each PS
task in turn until one holds it) every POLL_S; each time it has advanced, that is one PS step
(``rtkit_step_mark()`` via the step recorder, as a manual step).

Why the global step and not the RPC tensors' rhythm: every worker update bumps it exactly once, it
exists in every ``MonitoredTrainingSession``/``minimize(global_step=...)`` script, reading it costs one
scalar read on a local device, and it needs no access to gRPC internals. What it cannot give: with async
workers a poll can see several updates at once (a PS step is then "all updates since the last poll");
a script without a global step gets no PS steps (the PS report says so in its notes).
"""
from __future__ import annotations

import os
import threading
import time

POLL_S = 0.02
FLUSH_S = 1.0
_started = False


def _poll(tf, server, ps_tasks: int, rec) -> None:
    from rtkit.hooks import registry
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
    found, flushed_t = None, last_t
    with registry.internal():   # these reads are not steps of the session hooks
        sess = tf.compat.v1.Session(server.target, graph=graph, config=config)
        while True:
            candidates = [found] if found is not None else range(ps_tasks)
            value = None
            for k in candidates:
                try:
                    value = int(sess.run(reads[k]))
                    found = k
                    break
                except Exception:   # not created yet (the chief has not initialised), or on another PS
                    continue
            if value is not None and last is not None and value > last:
                now_unix, now, faults = time.time(), time.perf_counter(), minor_faults()
                rec.record("manual", "ps: global_step advanced", last_unix, (now - last_t) * 1000.0, faults - last_faults)
                last_unix, last_t, last_faults = now_unix, now, faults
            if value is not None:
                last = value
            if last_t > flushed_t and time.perf_counter() - flushed_t > FLUSH_S:
                # a PS ends by SIGTERM while blocked in join(): no atexit flush, so keep the file current
                rec.flush()
                flushed_t = time.perf_counter()
            time.sleep(POLL_S)


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
        threading.Thread(target=_poll, args=(tf, self, ps_tasks, rec), daemon=True, name="rtkit-ps-steps").start()
        rec.notes.append("parameter server: a step is an advance of the cluster's global_step, polled every "
                         f"{POLL_S * 1000:.0f} ms from this process")

    server_cls.__init__ = __init__
