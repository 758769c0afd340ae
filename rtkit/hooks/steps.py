# steps.py -- the one owner of "what is a training step": records every candidate, applies one rule, tells subscribers.
"""Every API's hook hands its runs here: a tf.compat.v1 session run (Session.run, make_callable and
MonitoredTrainingSession share one path) under its run signature, a tf.function call under its function's
name, a Keras fit train batch, an explicit rtkit.step(). One rule picks the training step:

* explicit marks first (rtkit.step(), a parameter server's global step or step clock), then Keras fit's
  train batches, then a TF2 ClusterCoordinator's scheduled steps, then the calls rtkit infers steps from (session runs and tf.function calls, compared with each other);
* among inferred calls, the signature that recurs most, at least MIN_RECURRENCE times (a run made once, such
  as a variable initialiser, is never the step); a run with target ops (a train op) beats fetch-only runs
  that recur at most twice as often (MonitoredTrainingSession's hooks read global_step a few extra times);
* a call that computes gradients trains (a tf.function whose graph has a GradientTape's or tf.gradients' ops, a
  session run whose targets or fetches depend on them: an optimizer's train op; hooks/gradient_ops.py): it beats
  any call that computes none, however often that recurs (an evaluation step over a larger validation set, a
  predict loop over the training, validation and test sets);
* a tf.function that traces again on most of its calls (a new input signature each time) is a retracing
  storm: reported with its trace count, never the step.

Subscribers learn of each step as it ends: ``subscribe(callback)`` with ``callback(signature: str, ms: float)``,
called on the thread that ran the step, after it ran, outside any rtkit lock; ``signature`` is the chosen
signature's name (``targets=...``/``fetches=...`` for sessions, ``tf.function <module>.<name>``,
``keras.Model.fit``, ``rtkit.step()``) and ``ms`` the step's wall time (for a session run, the scheduler's
wait for a staged batch included). A subscriber that raises is noted once in the step file and kept. The
allocator's rtkit_step_mark() is the first subscriber. Results go to RTKIT_RUN_DIR/steps-<pid>.json,
rewritten atomically every few seconds and at exit, so a killed job still leaves most of its steps."""
from __future__ import annotations

import ctypes
import os
import resource
import threading
import time
from typing import Callable, Dict, List, Optional

from rtkit import atomic, step_records
from rtkit.report.contract import Steps as _ST
from rtkit.report.keras_epochs import keras_summary

FLUSH_INTERVAL_S = 5.0
FLUSH_BUDGET = 0.02  # a periodic flush may take at most this share of the time between flushes
MAX_RECORDS = 200_000  # per signature; beyond it steps are counted but their records dropped
HOOK_RUN_PREFIX = "hook run: "
MIN_RECURRENCE = 2     # calls of an inferred signature before it can be the step
EXPLICIT_SOURCES = ("manual", "keras", "coordinator")   # a step each call, in this order of precedence
INFERRED_SOURCES = ("function", "session")  # steps inferred from recurring calls, compared by one rule
NO_STEP_HINT = "mark each step with rtkit.step() at the end of the loop body"
_PAGE = os.sysconf("SC_PAGE_SIZE")


# /proc/self/statm, kept open (one pread instead of an open, read and close); in a TF process a read costs several
# microseconds, as much as the rest of a step's recording, so a step reuses a value at most RSS_MAX_AGE_S old
RSS_MAX_AGE_S = 0.005
_statm = {"fd": None, "t": -1.0, "rss": None}


def _rss_bytes() -> Optional[int]:
    now = time.monotonic()
    if now - _statm["t"] < RSS_MAX_AGE_S:
        return _statm["rss"]
    try:
        if _statm["fd"] is None:
            _statm["fd"] = os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)
        rss = int(os.pread(_statm["fd"], 128, 0).split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        rss = None
    _statm["t"], _statm["rss"] = now, rss
    return rss


def _reopen_statm_after_fork() -> None:
    """The inherited descriptor reads the parent's /proc entry (/proc/self resolved at open): the child opens its own."""
    fd, _statm["fd"], _statm["t"] = _statm["fd"], None, -1.0
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass


def minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _find_step_mark():
    """rtkit_step_mark() of the preloaded allocator, looked up in the global namespace; None when absent."""
    try:
        fn = ctypes.CDLL(None).rtkit_step_mark
    except (AttributeError, OSError):
        return None
    fn.restype = None
    fn.argtypes = []
    return fn


class _Signature:
    __slots__ = ("name", "count", "total_ms", "records", "api", "candidate", "traces", "trains")

    def __init__(self, name: str, api: Optional[str] = None, candidate: bool = True):
        self.name = name
        self.api = api
        self.candidate = candidate   # False: runs known not to be training steps (a hook's own runs)
        self.count = 0
        self.total_ms = 0.0
        self.records: List[tuple] = []
        self.traces = 0              # tf.function: calls that traced a new concrete function
        self.trains = False          # a traced graph (tf.function) or a run's ops (session) compute gradients

    def retracing(self) -> bool:
        """A tf.function that traced on more than half of its calls (each trace after the first is a retrace)."""
        return self.traces > 1 and self.traces * 2 > self.count


def _eligible(sig: "_Signature", source: str) -> bool:
    if not sig.candidate:
        return False
    if source in EXPLICIT_SOURCES:
        return True
    return sig.count >= MIN_RECURRENCE and not sig.retracing()


def _beats(sig: "_Signature", best: "_Signature") -> bool:
    """Whether `sig` is the training step rather than `best`. A call that computes gradients (a tf.function's graph,
    a session run's ops) beats one that computes none. Else the one that recurs most, except that a run with
    target ops beats fetch-only runs that recur at most twice as often: MonitoredTrainingSession's hooks read
    global_step once per step and a few times more (at start, at checkpoints)."""
    if sig is best:
        return False
    if sig.trains != best.trains:
        return sig.trains
    mine, theirs = sig.name.startswith("targets="), best.name.startswith("targets=")
    if mine == theirs:
        return sig.count > best.count
    if mine:
        return sig.count * 2 >= best.count
    return sig.count > best.count * 2


def _best_of(sigs: List["_Signature"]) -> Optional["_Signature"]:
    best = None
    for s in sigs:
        if best is None or _beats(s, best):
            best = s
    return best


class StepRecorder:
    def __init__(self):
        self.lock = threading.RLock()  # RLock: a signal handler may flush while this thread records
        self.sources: Dict[str, Dict[str, _Signature]] = {k: {} for k in EXPLICIT_SOURCES + INFERRED_SOURCES}
        self.best: Dict[str, Optional[_Signature]] = {k: None for k in self.sources}
        self.subscribers: List[Callable[[str, float], None]] = []
        self._failed_subscribers: set = set()
        self.notes: List[str] = []
        self.hook = {"status": "no_tensorflow", "detail": "TensorFlow was not imported", "tensorflow_version": None}
        self.step_mark = _find_step_mark()
        # the step (of the per-step list's numbering) that first told the subscribers: the allocator's step k
        # (the span from its k-th mark to the next) is this step + k
        self.first_told_step: Optional[int] = None
        if self.step_mark is not None:   # the allocator's phase (profile, plan, serve) follows the steps
            mark = self.step_mark
            self.subscribe(lambda signature, ms: mark())
        self.run_dir = os.environ.get("RTKIT_RUN_DIR") or None
        self.last_flush = time.monotonic()
        self.flush_interval = FLUSH_INTERVAL_S
        self._records = step_records.Appender()   # the training step's records, each written once
        self.last_manual = (time.time(), time.perf_counter(), minor_faults())
        # Keras fit: one record per epoch (wall seconds, train batches, whether validation ran)
        self.keras_epochs: List[dict] = []
        # Keras fit calls begun: with no train batch ended, why no step came is not a missing hook (no_step_reason)
        self.keras_fit_calls = 0

    # -- recording

    def record_epoch(self, seconds: float, batches: int, validation: bool) -> None:
        with self.lock:
            self.keras_epochs.append({"epoch_s": round(seconds, 4), "train_batches": batches, "validation": validation})

    def subscribe(self, callback: Callable[[str, float], None]) -> None:
        """callback(signature, ms) after each training step (see the module's doc); once per callback."""
        if callback not in self.subscribers:
            self.subscribers.append(callback)

    def record(self, source: str, signature: str, start_unix: float, step_ms: float, faults: int,
               api: Optional[str] = None, candidate: bool = True, traced: bool = False, trains: bool = False,
               not_step_prefix: str = HOOK_RUN_PREFIX) -> bool:
        """One run of `signature`; returns whether it was the training step. candidate=False: a run that can never
        be the training step, however often it recurs (a SessionRunHook's own session.run inside a MonitoredSession
        step, a QueueRunner thread's enqueue); it is kept apart from the same fetches run as steps, named with
        not_step_prefix, counted and timed but its per-run records not kept (only the step's are ever written).
        traced: a tf.function call that traced a new concrete function; trains: its graph (a session run: its
        ops) computes gradients."""
        if _flush_waits_for_main and threading.current_thread() is threading.main_thread():
            _install_signal_flush()
        if not candidate:
            with self.lock:
                self._count_locked(source, not_step_prefix + signature, api, candidate, step_ms)
            if time.monotonic() - self.last_flush > self.flush_interval:
                self.flush()
            return False
        rss = _rss_bytes()
        with self.lock:
            table = self.sources[source]
            sig = self._count_locked(source, signature, api, candidate, step_ms)
            if traced:
                sig.traces += 1
            sig.trains = sig.trains or trains
            if len(sig.records) < MAX_RECORDS:
                sig.records.append((start_unix, step_ms, faults, rss))   # rounded when written
            if api is not None:
                sig.api = api   # the latest: a signature first seen while a session was being set up keeps no stale name
            best = self.best[source]
            if best is sig and not _eligible(sig, source):   # it began to retrace: the best of the rest
                self.best[source] = best = _best_of([s for s in table.values() if _eligible(s, source)])
            elif _eligible(sig, source) and (best is None or _beats(sig, best)):
                self.best[source] = best = sig
            is_step = best is sig and self._chosen_locked()[1] is sig
        if is_step:
            if self.first_told_step is None:
                self.first_told_step = sig.count
            for fn in tuple(self.subscribers):
                try:
                    fn(sig.name, step_ms)
                except Exception as exc:
                    if fn not in self._failed_subscribers:
                        self._failed_subscribers.add(fn)
                        self.notes.append(f"step subscriber {getattr(fn, '__qualname__', fn)} failed: {exc!r}")
        if time.monotonic() - self.last_flush > self.flush_interval:
            self.flush()
        return is_step

    def _count_locked(self, source: str, signature: str, api: Optional[str], candidate: bool,
                      step_ms: float) -> "_Signature":
        """The signature's entry in its source's table (made on first sight), with this run counted and timed."""
        table = self.sources[source]
        sig = table.get(signature)
        if sig is None:
            sig = table[signature] = _Signature(signature, api, candidate)
        sig.count += 1
        sig.total_ms += step_ms
        return sig

    def manual_step(self) -> None:
        now_unix, now, faults = time.time(), time.perf_counter(), minor_faults()
        prev_unix, prev, prev_faults = self.last_manual
        self.last_manual = (now_unix, now, faults)
        self.record("manual", "rtkit.step()", prev_unix, (now - prev) * 1000.0, faults - prev_faults, "rtkit.step()")

    # -- output

    def chosen(self):
        """(source, signature) that counts as the training step (see the module's doc for the rule)."""
        with self.lock:
            return self._chosen_locked()

    def _chosen_locked(self):
        for source in EXPLICIT_SOURCES:
            if self.best[source] is not None:
                return source, self.best[source]
        source, best = "none", None
        for name in INFERRED_SOURCES:
            sig = self.best[name]
            if sig is not None and (best is None or _beats(sig, best)):
                source, best = name, sig
        return source, best

    def no_step_reason(self) -> Optional[str]:
        """Why no step was counted although TensorFlow ran, with the way to mark steps; None when steps were."""
        if self._chosen_locked()[1] is not None:
            return None
        storms = [s for s in self.sources["function"].values() if s.retracing()]
        if storms:
            worst = max(storms, key=lambda s: s.traces)
            return (f"no step signature: {worst.name} retraced on every call ({worst.traces} traces in "
                    f"{worst.count} calls; pass tensors, not Python values, or give it an input_signature); "
                    + NO_STEP_HINT)
        if self.hook.get("status") == "no_tensorflow":
            return None
        if self.keras_fit_calls:   # the fit's batches are the steps: rtkit.step() would not help, the job's end did
            times = "once" if self.keras_fit_calls == 1 else f"{self.keras_fit_calls} times"
            return (f"Keras Model.fit was called {times} and none of its train batches ended: it failed or stopped "
                    "in its first batch, or its input was empty")
        return f"{_ST.NOTHING_RECURRED} (an eager loop of ops has none); {NO_STEP_HINT}"

    def snapshot(self, records: bool = True) -> dict:
        """The steps file's content; records=False leaves the per-step list out (the records file has it)."""
        with self.lock:
            source, sig = self._chosen_locked()
            others = [dict({"signature": s.name, "count": s.count, "total_ms": round(s.total_ms, 3), "source": src},
                           **({"traces": s.traces} if s.traces else {}))
                      for src, table in self.sources.items() for s in table.values() if s is not sig]
            others.sort(key=lambda o: -o["count"])
            kept = len(sig.records) if sig else 0
            hook = dict(self.hook)
            if sig is not None and sig.api:   # the hooks that are installed matter less than the one that counted
                hook["detail"] = f"steps counted from {sig.api}" + (f"; {hook['detail']}" if hook.get("detail") else "")
            return {
                "api": sig.api if sig else None,
                "keras_summary": keras_summary(self.keras_epochs) if source == "keras" else None,
                "keras_fit_calls": self.keras_fit_calls,
                "pid": os.getpid(),
                "source": source,
                "signature": sig.name if sig else None,
                "count": sig.count if sig else 0,
                "truncated_steps": (sig.count - kept) if sig else 0,
                **({"per_step": [{"t_unix": round(r[0], 6), "step_ms": round(r[1], 4), "minor_faults": r[2],
                                  "rss_bytes": r[3]} for r in list(sig.records)] if sig else []} if records else {}),
                "other_signatures": others[:20],
                "hook": hook,
                "allocator_step_mark": self.step_mark is not None,
                "first_told_step": self.first_told_step,
                "no_step_reason": self.no_step_reason(),
                "notes": list(self.notes),
                # rtkit's own files this process wrote before this one (the parent adds this file's size)
                "run_files_written_bytes": atomic.written_bytes,
            }

    def flush(self) -> None:
        started = self.last_flush = time.monotonic()
        if not self.run_dir:
            return
        try:
            self._write()
        finally:
            # long jobs have long step lists: space the rewrites out so they stay a small share of the run
            self.flush_interval = max(FLUSH_INTERVAL_S, (time.monotonic() - started) / FLUSH_BUDGET)

    def _write(self) -> None:
        with self.lock:
            source, sig = self._chosen_locked()
            count = sig.count if sig else 0
        if count == 0 and self.hook["status"] == "no_tensorflow":
            return  # a helper process that never touched TensorFlow: leave no file
        try:
            # the records first: the steps file's count of bytes written includes them
            written = self._records.write(self.run_dir, sig.name, sig.records) if sig else 0
            data = self.snapshot(records=False)
            data.update({"per_step_file": step_records.file_name(os.getpid()), "per_step_written": written})
            atomic.write_json(os.path.join(self.run_dir, f"steps-{os.getpid()}.json"), data, indent=None)
        except OSError:
            pass  # an unwritable run dir was reported by the parent already

    def reset_after_fork(self) -> None:
        _reopen_statm_after_fork()
        self._records = step_records.Appender()   # the child's records go to files of its own pid
        self.lock = threading.RLock()  # RLock: a signal handler may flush while this thread records
        for table in self.sources.values():
            table.clear()
        self.best = {k: None for k in self.best}
        self.keras_epochs = []
        self.keras_fit_calls = 0
        self.last_manual = (time.time(), time.perf_counter(), minor_faults())


_recorder: Optional[StepRecorder] = None
# two threads' first steps at once make one recorder (a second would take, and lose, one thread's steps); an RLock: a
# signal handler of the thread that makes it may step meanwhile
_create_lock = threading.RLock()
# the recorder was made on a thread other than the main one, where no Python signal handler can be set: the main
# thread's next step (or other call into rtkit's hooks) sets the SIGTERM/SIGHUP/SIGQUIT flush
_flush_waits_for_main = False


def _reset_after_fork() -> None:
    global _create_lock
    _create_lock = threading.RLock()   # a thread of the parent may have held it at the fork
    if _recorder is not None:
        _recorder.reset_after_fork()


os.register_at_fork(after_in_child=_reset_after_fork)


def _install_signal_flush() -> None:
    """SIGTERM/HUP/QUIT flush the steps too, the exit status unchanged; set from the main thread alone."""
    global _flush_waits_for_main
    if threading.current_thread() is not threading.main_thread():
        _flush_waits_for_main = True
        return
    _flush_waits_for_main = False
    from rtkit.hooks import signal_flush

    signal_flush.install(_recorder.flush)


def _flush_if_made() -> None:
    if _recorder is not None:
        _recorder.flush()


def install_signal_flush_at_start() -> None:
    """The bootstrap, in the main thread of the command's own process: SIGTERM/HUP/QUIT flush the steps from the start,
    whichever thread makes the recorder later (that thread can set no handler, and the main thread may never call into
    rtkit again: it waits in join() for the training thread). This module's at-fork hook is registered by now, before
    signal_flush's, as install() asks."""
    from rtkit.hooks import signal_flush

    signal_flush.install(_flush_if_made)


def recorder() -> StepRecorder:
    rec = _recorder if _recorder is not None else _create()
    if _flush_waits_for_main and threading.current_thread() is threading.main_thread():
        _install_signal_flush()   # the main thread's first call into rtkit since another thread made it
    return rec


def _create() -> StepRecorder:
    global _recorder
    with _create_lock:
        if _recorder is None:
            made = StepRecorder()
            if _recorder is None:   # else a signal handler of this thread stepped meanwhile, and made it
                _recorder = made
                import atexit

                atexit.register(made.flush)
                _install_signal_flush()
        return _recorder


def manual_step() -> None:
    recorder().manual_step()


def subscribe(callback: Callable[[str, float], None]) -> None:
    """callback(signature, ms) after each training step of this process (see the module's doc)."""
    recorder().subscribe(callback)
