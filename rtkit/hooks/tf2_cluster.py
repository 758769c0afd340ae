# tf2_cluster.py -- TF2 distributed hooks: a task serving in Server.join() tells `rtkit launch`; ClusterCoordinator steps.
"""Two facts of a ``ParameterServerStrategy`` job that only the process itself knows:

- **A worker that serves.** In TF2's parameter-server training the workers, like the parameter servers,
  only start a ``tf.distribute.Server`` and block in ``join()``; the coordinator (chief) sends them
  functions. They never end by themselves, so `rtkit launch` cannot wait for them as it waits for TF1
  workers. When a task enters ``join()``, the hook creates the file named by ``RTKIT_LAUNCH_SERVING``
  (set by `rtkit launch`, one path per task and attempt); the launcher then counts that task as done
  training and stops it with the parameter servers once every training task is done or serving.
- **The coordinator's steps.** ``ClusterCoordinator.schedule(fn)`` queues one step of ``fn`` on some
  worker and returns at once, unless the queue is full: then it waits for a worker. So the time between
  two ``schedule`` calls of the same function is the rate at which the cluster takes steps, which is
  what the coordinator's step time means here. Each call is recorded as a step of the signature
  ``ClusterCoordinator.schedule(<fn>)`` (one signature per function), through the step recorder, which
  decides with its one rule which signature is the training step.
"""
from __future__ import annotations

import os
import threading
import time

from rtkit.cluster.taskdir import FOLLOWER_SIGNATURE
from rtkit.hooks import steps

SERVING_ENV = "RTKIT_LAUNCH_SERVING"
CLOCK_ENV = "RTKIT_LAUNCH_CLOCK"
SCHEDULE_API = "ClusterCoordinator.schedule"
CLOCK_SIGNATURE = FOLLOWER_SIGNATURE
CLOCK_POLL_S = 0.01


class StepClock:
    """The job's count of coordinator steps, in an 8-byte file that `rtkit launch` made for all its tasks:
    the coordinator adds one per step (a store into shared memory, no system call), serving tasks read it."""

    def __init__(self, path: str):
        import mmap

        fd = os.open(path, os.O_RDWR | getattr(os, "O_NOFOLLOW", 0))
        try:
            if os.fstat(fd).st_size < 8:
                raise OSError(f"{path} is not a step clock")
            self.map = mmap.mmap(fd, 8)
        finally:
            os.close(fd)
        self.lock = threading.Lock()

    def read(self) -> int:
        return int.from_bytes(self.map[:8], "little")

    def advance(self) -> None:
        with self.lock:   # the coordinator's threads (one per worker) add to it: a read and a store each
            self.map[:8] = (self.read() + 1).to_bytes(8, "little")


def open_clock(rec):
    path = os.environ.get(CLOCK_ENV)
    if not path:
        return None
    try:
        return StepClock(path)
    except (OSError, ValueError) as exc:
        rec.notes.append(f"cluster step clock {path} not usable ({exc}): serving tasks get no steps")
        return None


def _follow_clock(clock: StepClock, rec, per_step: int) -> None:
    """A serving task's steps: one each time the coordinator's count advanced by `per_step` (its share of the
    workers' steps), so its allocator profiles and plans at about the rhythm of the steps it runs."""
    last = clock.read()
    last_unix, last_t, last_faults = time.time(), time.perf_counter(), steps.minor_faults()
    flushed, superseded = last_t, False
    while True:
        time.sleep(CLOCK_POLL_S)
        value = clock.read()
        if value - last >= per_step:
            if not superseded:   # a coordinator exists: this is TF2 PS training, whose jobs have no global_step
                from rtkit.hooks import ps_steps

                ps_steps.stop_polling(rec)
                superseded = True
            now_unix, now, faults = time.time(), time.perf_counter(), steps.minor_faults()
            rec.record("manual", CLOCK_SIGNATURE, last_unix, (now - last_t) * 1000.0, faults - last_faults,
                       api="the coordinator's step clock (rtkit launch)")
            last, last_unix, last_t, last_faults = value, now_unix, now, faults
        elif value < last:   # a new job in the same file: follow it from here
            last = value
        if last_t > flushed and time.perf_counter() - flushed > 1.0:
            rec.flush()   # a serving task ends by SIGTERM: keep its file current
            flushed = time.perf_counter()


def _announce_serving(rec) -> None:
    path = os.environ.get(SERVING_ENV)
    rec.notes.append("this task served in tf.distribute.Server.join() (a TF2 worker or parameter server: its steps "
                     "run as functions sent by the coordinator)")
    rec.flush()   # a serving task ends by SIGTERM: keep what it recorded so far
    if not path:
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
        os.write(fd, f"{os.getpid()}\n".encode())
        os.close(fd)
    except FileExistsError:
        pass
    except OSError as exc:
        rec.notes.append(f"could not tell rtkit launch that this task serves ({path}: {exc.strerror})")


def _workers_in(server) -> int:
    jobs = getattr(getattr(server.server_def, "cluster", None), "job", ())
    return max(1, next((len(j.tasks) for j in jobs if j.name == "worker"), 1))


def install_server_join(tf) -> None:
    server_cls = tf.distribute.Server
    if getattr(server_cls.join, "_rtkit_hooked", False):
        return
    orig_join = server_cls.join
    rec = steps.recorder()
    followed = []

    def join(self, *args, **kwargs):
        _announce_serving(rec)
        clock = open_clock(rec) if not followed else None
        if clock is not None:
            followed.append(clock)
            job = getattr(self.server_def, "job_name", "")
            per_step = _workers_in(self) if job == "worker" else 1   # a PS serves every step, a worker its share
            threading.Thread(target=_follow_clock, args=(clock, rec, per_step), daemon=True,
                             name="rtkit-step-clock").start()
            rec.notes.append(f"a step of this serving task: at least {per_step} step(s) scheduled by the coordinator "
                             f"(rtkit launch's step clock, read every {CLOCK_POLL_S * 1000:.0f} ms)")
        return orig_join(self, *args, **kwargs)

    join._rtkit_hooked = True
    server_cls.join = join


def _closure_name(closure) -> str:
    """The scheduled function's own name: a tf.function's traced graph is named after it (the closure holds
    a cancellable wrapper of it); a plain Python function keeps its __name__."""
    concrete = getattr(closure, "_concrete_function", None)
    name = getattr(getattr(concrete, "graph", None), "name", None)
    if not name:
        fn = getattr(closure, "_function", None)
        name = getattr(fn, "__name__", None) or type(fn).__name__
    return str(name)


def install_coordinator(tf) -> None:
    """Time each scheduled step where the coordinator runs it: ``Worker._process_closure`` sends the function to
    its worker and waits for its outputs, on one coordinator thread per worker. The step is recorded as the queue
    hears that it finished (``mark_finished``), not after: ``coordinator.join()`` returns on that news, and a
    script that exits right after it must find every step recorded."""
    from tensorflow.python.distribute.coordinator import cluster_coordinator

    cls = cluster_coordinator.Worker
    queue_cls = cluster_coordinator._CoordinatedClosureQueue
    orig, orig_finished = cls._process_closure, queue_cls.mark_finished
    if getattr(orig, "_rtkit_hooked", False):
        return
    rec = steps.recorder()
    clock = open_clock(rec)
    running = threading.local()   # this coordinator thread's closure: (start unix, start, faults, signature)

    def record_running():
        step = getattr(running, "step", None)
        if step is None:
            return
        running.step = None
        start_unix, start, faults, signature = step
        rec.record("coordinator", signature, start_unix, (time.perf_counter() - start) * 1000.0,
                   steps.minor_faults() - faults, api=SCHEDULE_API)
        if clock is not None:
            clock.advance()

    def _process_closure(self, closure):
        running.step = (time.time(), time.perf_counter(), steps.minor_faults(),
                        f"{SCHEDULE_API}({_closure_name(closure)})")
        try:
            return orig(self, closure)
        finally:
            record_running()   # a closure that failed: it never reached mark_finished

    def mark_finished(self, *args, **kwargs):
        record_running()
        return orig_finished(self, *args, **kwargs)

    _process_closure._rtkit_hooked = True
    cls._process_closure = _process_closure
    queue_cls.mark_finished = mark_finished


def install(tf, rec) -> None:
    for what, fn in (("tf.distribute.Server.join", install_server_join),
                     ("ClusterCoordinator.schedule", install_coordinator)):
        try:
            fn(tf)
        except Exception as exc:   # the script runs unchanged
            rec.notes.append(f"{what} hook not installed: {exc!r}")
