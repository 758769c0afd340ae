# session.py -- patches tf.compat.v1 BaseSession: config filters at creation, run wrappers, step timing, close.
"""Timing sits in BaseSession._call_tf_sessionrun, the one path under run(), make_callable() and
MonitoredTrainingSession, and starts where BaseSession._run began (the feeds' conversion is the step's); the
signature is the target ops when there are any (a train op stays the same when hooks add fetches), else the
fetched tensors.

Inside a MonitoredSession.run call, only the one run that carries the caller's fetches (with the hooks'
before_run requests merged in) can be a training step; runs a SessionRunHook makes itself through
``run_context.session`` (a step-based CheckpointSaverHook's global-step read and save, StopAtStepHook's read,
a user hook's own ops) are recorded as hook runs, so however often they recur they never outvote the train op.
Likewise the runs of a QueueRunner's threads (one enqueue per example of a tf.train.shuffle_batch input, tens
of thousands in a short job) are recorded as queue-runner runs, never steps.

What a component (the scheduler) needs from this timing is here too: `internal()` marks rtkit's own session
runs, which are not training steps; `before_run(ms)` adds time a component spent on a run's behalf before it
reached TensorFlow (waiting for a staged batch) to the step that follows on the same thread, so a step's time
is what the script waited for, not TF's part alone; `timed_run` times a run a component makes through a path
these hooks do not see (a callable made from CallableOptions) and records it as the run it stands for."""
from __future__ import annotations

import contextlib
import threading
import time

from rtkit.hooks import gradient_ops, registry
from rtkit.hooks.steps import HOOK_RUN_PREFIX, minor_faults, recorder

QUEUE_RUNNER_PREFIX = "queue runner: "

_PATCHED_FLAG = "_rtkit_patched"
# which API a session step came through, for the report's words: Session.run sets `run`, MonitoredSession's run
# sets `monitored`, a make_callable callable sets `callable` (one without feeds skips run() altogether)
_where = threading.local()
_local = threading.local()   # per thread: inside internal(), and the time components spent before the next run
_timer = None                # set by install(): fn(session, fetch names, target names, call), timed and recorded


@contextlib.contextmanager
def internal():
    """Session runs made by rtkit itself (e.g. a pipelined input stage) inside this block are not steps."""
    previous = getattr(_local, "internal", False)
    _local.internal = True
    try:
        yield
    finally:
        _local.internal = previous


def is_internal() -> bool:
    return getattr(_local, "internal", False)


def before_run(ms: float) -> None:
    """A component spent `ms` before this thread's next session run, on that run's behalf."""
    _local.pre_ms = getattr(_local, "pre_ms", 0.0) + float(ms)


def _take_before_run_ms() -> float:
    """The time components spent before this run (consumed: the next run starts from zero)."""
    ms = getattr(_local, "pre_ms", 0.0)
    _local.pre_ms = 0.0
    return ms


def timed_run(session, fetch_names, target_names, call):
    """Run `call()` (one TF call for `session`) timed and recorded as a Session.run with these fetches and targets
    is; just call() when the session hooks are not installed."""
    timer = _timer
    return call() if timer is None else timer(session, fetch_names, target_names, call)


def api_now() -> str:
    if getattr(_where, "monitored", 0):
        return "tf.compat.v1 MonitoredTrainingSession"
    if getattr(_where, "callable", 0) or not getattr(_where, "run", 0):
        return "tf.compat.v1 Session.make_callable"   # with a feed list, TF's callable goes through run()
    return "tf.compat.v1 Session.run"


def _counting(attr: str, fn):
    def wrapped(*args, **kwargs):
        depth = getattr(_where, attr, 0)
        setattr(_where, attr, depth + 1)
        try:
            return fn(*args, **kwargs)
        finally:
            setattr(_where, attr, depth)
    wrapped.__wrapped__ = fn
    wrapped.__doc__ = fn.__doc__
    return wrapped


def _names(items, name_of, with_index: bool) -> str:
    out = []
    for item in items or ():
        try:
            if with_index:
                out.append(f"{name_of(item.oper)}:{item.index}")
            else:
                out.append(name_of(item))
        except Exception:
            out.append("?")
    return ",".join(sorted(out))


def _mark_callables(base) -> None:
    """make_callable's callables run with `callable` set, whatever else wraps make_callable."""
    inner = base.make_callable

    def make_callable(self, fetches, feed_list=None, accept_options=False):
        return _counting("callable", inner(self, fetches, feed_list, accept_options))

    make_callable.__wrapped__ = inner
    make_callable.__doc__ = inner.__doc__
    base.make_callable = make_callable


def _op_names(fetch_list, target_list, name_of):
    """The names of a run's target ops and of the ops whose outputs it fetches (read only when not yet known)."""
    for item in target_list or ():
        yield name_of(item)
    for item in fetch_list or ():
        yield name_of(item.oper)


def signature_of(fetch_list, target_list, name_of) -> str:
    targets = _names(target_list, name_of, with_index=False)
    if targets:
        return "targets=" + targets
    return "fetches=" + _names(fetch_list, name_of, with_index=True)


def signature_of_names(fetch_names, target_names) -> str:
    """signature_of for names ('op' targets, 'op:index' fetches): the same string for the same run."""
    if target_names:
        return "targets=" + ",".join(sorted(target_names))
    return "fetches=" + ",".join(sorted(fetch_names))


def timed(signature, call, rec=None, trains=None):
    """call() (one TF call of a session), timed and handed to the step owner as a run of signature() (called after
    the run, so the signature costs nothing when call() raises); rec: the process's step recorder by default.
    Inside BaseSession._run (Session.run, a make_callable callable with feeds) the step starts where _run began:
    it converts the feed_dict's values to arrays first (Python lists of ids, a feed-style CTR script's batches:
    milliseconds a step), and the script waits for that as for TF's call.
    trains(signature): whether the run computes gradients (a train op), asked of runs that may be steps only."""
    rec = rec or recorder()
    start_unix, t0, f0 = time.time(), time.perf_counter(), minor_faults()
    entered = getattr(_local, "run_entered", None)
    if entered is not None:   # inside BaseSession._run: the step began there, with the feeds' conversion
        _local.run_entered = None   # one TF call per _run is its step; none after it starts there
        start_unix, t0, f0 = entered
    result = call()
    elapsed_ms = (time.perf_counter() - t0) * 1000.0
    pre_ms = _take_before_run_ms()  # e.g. the scheduler's wait for a staged batch: part of the step
    start_unix -= pre_ms / 1000.0
    elapsed_ms += pre_ms
    # in a MonitoredSession.run, a run outside the hooked session's own is a hook's: never a step
    candidate = not getattr(_where, "monitored", 0) or getattr(_where, "hooked", 0) > 0
    prefix = HOOK_RUN_PREFIX
    if getattr(_where, "queue_runner", 0):   # an input thread's enqueue or close: never a step
        candidate, prefix = False, QUEUE_RUNNER_PREFIX
    try:
        sig = signature()
        rec.record("session", sig, start_unix, elapsed_ms, minor_faults() - f0, api_now(), candidate,
                   trains=bool(candidate and trains is not None and trains(sig)), not_step_prefix=prefix)
    except Exception as exc:
        rec.notes.append(f"step recording failed: {exc!r}")
    return result


def install(session_module, pywrap) -> None:
    global _timer
    base = session_module.BaseSession
    if getattr(base, _PATCHED_FLAG, False):
        return
    rec = recorder()
    name_of = pywrap.TF_OperationName

    orig_init = base.__init__
    orig_run = base.run
    orig_call = base._call_tf_sessionrun
    orig_close = base.close
    orig_make_callable = base.make_callable
    orig_private_run = base._run

    def __init__(self, target="", graph=None, config=None):
        for fn in list(registry.config_filters):
            try:
                config = fn(config)
            except Exception as exc:  # a component's bug must not stop the user's session
                rec.notes.append(f"config filter {getattr(fn, '__name__', fn)} failed: {exc!r}")
        orig_init(self, target, graph, config)

    def run(self, fetches, feed_dict=None, options=None, run_metadata=None):
        depth = getattr(_where, "run", 0)
        _where.run = depth + 1
        try:
            return _run(self, fetches, feed_dict, options, run_metadata)
        finally:
            _where.run = depth

    def _run(self, fetches, feed_dict=None, options=None, run_metadata=None):
        wrappers = registry.run_wrappers
        if not wrappers:
            return orig_run(self, fetches, feed_dict, options, run_metadata)

        def chain(index):
            if index == len(wrappers):
                return lambda f, fd=None, o=None, m=None: orig_run(self, f, fd, o, m)
            wrapper, nxt = wrappers[index], chain(index + 1)
            return lambda f, fd=None, o=None, m=None: wrapper(self, nxt, f, fd, o, m)

        return chain(0)(fetches, feed_dict, options, run_metadata)

    def _run_entered_here(self, *args, **kwargs):
        """BaseSession._run: where TF's own part of a run begins (after rtkit's run wrappers, whose time a component
        adds itself with before_run): the step's start, taken by the TF call that follows (see timed)."""
        _local.run_entered = (time.time(), time.perf_counter(), minor_faults())
        try:
            return orig_private_run(self, *args, **kwargs)
        finally:
            _local.run_entered = None

    def _call_tf_sessionrun(self, options, feed_dict, fetch_list, target_list, run_metadata):
        if is_internal():
            return orig_call(self, options, feed_dict, fetch_list, target_list, run_metadata)
        return timed(lambda: signature_of(fetch_list, target_list, name_of),
                     lambda: orig_call(self, options, feed_dict, fetch_list, target_list, run_metadata),
                     trains=lambda sig: gradient_ops.run_computes_gradients(
                         self.graph, sig, _op_names(fetch_list, target_list, name_of)))

    def timed_names(session, fetch_names, target_names, call):
        """timed_run: a component's run of these fetches/targets (names) that does not pass here."""
        if is_internal():
            return call()
        return timed(lambda: signature_of_names(fetch_names, target_names), call,
                     trains=lambda sig: gradient_ops.run_computes_gradients(
                         session.graph, sig, [n.split(":")[0] for n in fetch_names or ()] + list(target_names or ())))

    def make_callable(self, fetches, feed_list=None, accept_options=False):
        wrappers = registry.callable_wrappers
        if not wrappers:
            return orig_make_callable(self, fetches, feed_list, accept_options)

        def chain(index):
            if index == len(wrappers):
                return lambda f, fl=None, a=False: orig_make_callable(self, f, fl, a)
            wrapper, nxt = wrappers[index], chain(index + 1)
            return lambda f, fl=None, a=False: wrapper(self, nxt, f, fl, a)

        return chain(0)(fetches, feed_list, accept_options)

    def close(self):
        for fn in list(registry.close_callbacks):
            try:
                fn(self)
            except Exception as exc:
                rec.notes.append(f"close callback {getattr(fn, '__name__', fn)} failed: {exc!r}")
        return orig_close(self)

    for name, fn, orig in (("__init__", __init__, orig_init), ("run", run, orig_run),
                           ("_call_tf_sessionrun", _call_tf_sessionrun, orig_call), ("close", close, orig_close),
                           ("make_callable", make_callable, orig_make_callable),
                           ("_run", _run_entered_here, orig_private_run)):
        fn.__wrapped__ = orig
        fn.__doc__ = orig.__doc__
        setattr(base, name, fn)
    setattr(base, _PATCHED_FLAG, True)
    _timer = timed_names
    _mark_callables(base)
    _mark_queue_runners(rec)
    try:  # MonitoredTrainingSession's steps reach BaseSession.run through its wrappers: mark them
        from tensorflow.python.training import monitored_session

        ms = monitored_session._MonitoredSession
        if not getattr(ms.run, "_rtkit_counting", False):
            ms.run = _counting("monitored", ms.run)
            ms.run._rtkit_counting = True
    except Exception as exc:  # only the API's name in the report is lost
        rec.notes.append(f"MonitoredTrainingSession not told apart from Session.run: {exc!r}")
        return
    _mark_hooked_run(monitored_session, rec)


def _mark_hooked_run(monitored_session, rec) -> None:
    """_HookedSession.run makes the step's run as ``_WrappedSession.run(self, ...)`` (the base class's method,
    looked up at call time) and lets hooks run through the raw session: set `hooked` around that one call."""
    try:
        wrapped_cls, hooked_cls = monitored_session._WrappedSession, monitored_session._HookedSession
        orig = wrapped_cls.run
        if getattr(orig, "_rtkit_hooked", False):
            return

        def run(self, *args, **kwargs):
            if not isinstance(self, hooked_cls):
                return orig(self, *args, **kwargs)
            depth = getattr(_where, "hooked", 0)
            _where.hooked = depth + 1
            try:
                return orig(self, *args, **kwargs)
            finally:
                _where.hooked = depth

        run.__wrapped__ = orig
        run.__doc__ = orig.__doc__
        run._rtkit_hooked = True
        wrapped_cls.run = run
    except Exception as exc:  # hooks' own runs then count as candidates, as plain Session.run calls do
        rec.notes.append(f"MonitoredSession hook runs not told apart from its steps: {exc!r}")


def _mark_queue_runners(rec) -> None:
    """QueueRunner threads run their enqueue (and, at the end, close or cancel) ops in a loop of their own: set
    `queue_runner` around those loops, so their runs are told apart from the training loop's."""
    try:
        from tensorflow.python.training import queue_runner_impl

        cls = queue_runner_impl.QueueRunner
        for name in ("_run", "_close_on_stop"):
            fn = getattr(cls, name)
            if not getattr(fn, "_rtkit_queue_runner", False):
                marked = _counting("queue_runner", fn)
                marked._rtkit_queue_runner = True
                setattr(cls, name, marked)
    except Exception as exc:  # their enqueues then count as candidates, as plain Session.run calls do
        rec.notes.append(f"QueueRunner runs not told apart from steps: {exc!r}")
