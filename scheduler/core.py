# core.py -- the Scheduler: session config filter, per-run routing/in-graph staging/tracing/tuning, close and exit handling.
"""rtkit's hooks register these methods at their extension points: filter_config (config_filters),
wrap_run (run_wrappers), wrap_callable (callable_wrappers), filter_dataset (dataset_filters), on_close
(close_callbacks), at_exit (exit_callbacks), and on_step as a subscriber of the hooks' step owner, which alone
decides what a training step is: the scheduler never counts run signatures itself. Each method is also callable
directly, which is how the tests drive it before/without the hooks."""
from __future__ import annotations

import contextlib
import os
import statistics
import threading
import time
import weakref
from typing import Any, Callable, ContextManager, Dict, List, Optional, Tuple

import numpy as np

from . import pools as _pools
from .report import now_iso, write_profile, write_report
from .stages import STAGES, StageMap, analyze, reachable
from .staging import Runner, Staged, rewrite
from .trace import Trace
from .tuner import Tuner

TRACE_STEPS = 3          # step runs traced (SOFTWARE_TRACE: step stats without a profiler session, which FULL_TRACE would start and which two concurrent runs cannot share) to measure per-stage cost
WARM_RUNS = 3            # steps of the chosen signature before tracing starts
MAX_STEP_KEYS = 64       # run shapes remembered as the step's (for the decisions made before a run)
MAX_NOTES = 50
MAX_SAMPLES = 2000
MAX_CALLABLES = 32       # staged callables kept per session (each holds an executor of the step's graph)


def _leaves(fetches, out: List) -> List:
    """Every graph element of a fetch structure. Unlike tf.nest.flatten, dict keys may be anything
    (MonitoredTrainingSession's hooked fetch dict is keyed by hook objects and 'caller')."""
    if fetches is None:
        return out
    if isinstance(fetches, dict):
        for v in fetches.values():
            _leaves(v, out)
    elif isinstance(fetches, (list, tuple)):
        for v in fetches:
            _leaves(v, out)
    elif hasattr(fetches, "indices") and hasattr(fetches, "dense_shape"):  # SparseTensor(Value)
        out += [fetches.indices, fetches.values, fetches.dense_shape]
    else:
        out.append(fetches)
    return out


def _ends_with_prefetch(dataset) -> bool:
    ds = dataset
    for _ in range(8):  # with_options wraps the dataset; look through those wrappers
        name = type(ds).__name__
        if "Prefetch" in name:
            return True
        if "Options" not in name or not hasattr(ds, "_input_dataset"):
            return False
        ds = ds._input_dataset
    return False


class _GraphState:
    """One rewrite per graph, at the first run (or make_callable) any session makes on it: a session only
    sees an edge change if it has not run the consumer yet."""

    def __init__(self):
        self.analysis: Optional[StageMap] = None
        self.staged: Optional[Staged] = None
        self.reason: Optional[str] = None
        self.version = -1


class _SessionState:
    def __init__(self, routed: bool):
        self.routed = routed
        self.cache: Dict[Any, tuple] = {}
        self.callables: Dict[tuple, Any] = {}   # the staged step's callables (tensor connections), per run shape
        self.runner: Optional[Runner] = None
        self.lock = threading.Lock()


def _keep_callable(st: _SessionState, key: tuple, fn) -> None:
    """Keep a staged callable for its run shape; past MAX_CALLABLES (run shapes that never repeat) the oldest
    goes (dict order). Under the session's lock: two threads' steps evicting at once would both pick the same
    oldest key, and the second one's KeyError would surface in the user's Session.run."""
    with st.lock:
        if len(st.callables) >= MAX_CALLABLES:
            st.callables.pop(next(iter(st.callables)), None)
        st.callables[key] = fn


class Scheduler:
    def __init__(self, tf, settings: Dict[str, Any], run_dir: Optional[str],
                 internal: Callable[[], ContextManager] = contextlib.nullcontext,
                 before_run: Optional[Callable[[float], None]] = None,
                 timed_run: Optional[Callable[..., Any]] = None):
        self.tf = tf
        self._internal = internal  # the hooks' "not a step" context for rtkit's own session runs
        # tells the hooks' step timing how long a run spent here before TF (the wait for a staged batch): the
        # script waited for it, so it is part of the step
        self._before_run = before_run
        # a staged step reaches TF through a callable, not Session.run's path: the hooks time and record it as
        # the step it replaces (fn(session, fetch names, target names, call) -> call())
        self._timed_run = timed_run or (lambda session, fetch_names, target_names, call: call())
        self.settings = dict(settings)
        self.run_dir = run_dir
        self.stage = bool(settings.get("sched_stage"))
        self.depth = int(settings.get("sched_stage_depth") or 2)
        self.override = bool(settings.get("sched_override_user"))
        self.tune = bool(settings.get("sched_tune"))
        self.plan = _pools.make_plan(settings, self.tune)
        # the first candidate is the job as the script made it (TF-sized pool, the input stage run inline)
        self.tuner = self._new_tuner()
        self.active = {"compute": self.plan.compute_sizes[0], "input": self.plan.input_sizes[0],
                       "stage": self.stage and self.tuner is None}
        self.notes: List[str] = []
        self.errors: List[str] = []
        self.trace = Trace()
        self.sessions_info: List[Dict] = []
        self._graphs: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
        self._states: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
        self._runners: "weakref.WeakSet" = weakref.WeakSet()
        self._local = threading.local()
        self._lock = threading.Lock()
        self.step_signature: Optional[str] = None   # the step owner's name for the step (on_step)
        # this scheduler's run keys (sorted fetch names) of runs the step owner called steps: what is decided before
        # a run (tracing, the tuner's candidate) asks whether the run about to start is the step's
        self._step_keys: set = set()
        self.step_runs = 0
        self.step_ms: List[float] = []
        self._traced_steps = 0
        self._input_trace_left = 0
        self._traced_inputs = 0
        self.stage_cost_ms = {s: 0.0 for s in STAGES}
        self.input_run_cost_ms = 0.0
        self.last_analysis: Optional[StageMap] = None
        self.last_staged: Optional[Staged] = None
        self.stage_reason: Optional[str] = None
        self.keras: Dict[str, Any] = {}
        self.pin_result: Optional[Dict] = None
        self.profile_written: List[str] = []
        self.counts = {"runners_started": 0, "staged_steps": 0, "inline_steps": 0, "dropped_items": 0,
                       "errors_delivered": 0, "direct_input_runs": 0, "rewrites": 0, "input_runs": 0}
        self._depth: List[List[float]] = []      # [t, items staged] when a step took its item
        self._overlap: List[List[float]] = []    # [step, put ms, wait ms, hidden %]
        self._ident = 0
        self._finished = False

    # ------------------------------------------------------------------ helpers
    def _new_tuner(self) -> Optional[Tuner]:
        if not self.tune:
            return None
        return Tuner(self.plan.compute_sizes, self.plan.input_sizes, int(self.settings.get("sched_tune_steps") or 0),
                     stage_options=(False, True) if self.stage else (False,))

    def note(self, text: str) -> None:
        with self._lock:
            if text not in self.notes and len(self.notes) < MAX_NOTES:
                self.notes.append(text)

    def _error(self, text: str) -> None:
        self.note(text)
        with self._lock:
            if text not in self.errors and len(self.errors) < MAX_NOTES:
                self.errors.append(text)

    def _rtkit_routed(self, config) -> bool:
        return config is not None and any(p.global_name.startswith("rtkit_")
                                          for p in config.session_inter_op_thread_pool)

    # ------------------------------------------------------------------ Keras / tf.function
    def configure_eager(self) -> None:
        th = self.tf.config.threading
        want = {"inter_op_threads": self.active["compute"], "intra_op_threads": self.plan.intra_op}
        try:
            if not th.get_inter_op_parallelism_threads():
                th.set_inter_op_parallelism_threads(want["inter_op_threads"])
            if not th.get_intra_op_parallelism_threads():
                th.set_intra_op_parallelism_threads(want["intra_op_threads"])
            self.keras = {"applied": True, **want}
        except RuntimeError as exc:  # the eager context was initialised before rtkit got here
            self.keras = {"applied": False, "detail": str(exc)}
            self.note(f"tf.config.threading could not be set (runtime already initialised): {exc}")

    def filter_dataset(self, dataset):
        """A tf.data input of Keras fit or of an eager loop: the input pool's size as the dataset's private thread
        pool and, with staging on, a final prefetch of sched_stage_depth batches; an option the script set itself
        wins."""
        try:
            if not isinstance(dataset, self.tf.data.Dataset):
                return dataset
            applied: Dict[str, Any] = {}
            out = dataset
            if not dataset.options().threading.private_threadpool_size:
                opts = self.tf.data.Options()
                opts.threading.private_threadpool_size = self.active["input"]
                out = out.with_options(opts)
                applied["private_threadpool_size"] = self.active["input"]
            else:
                applied["private_threadpool_size"] = "the script's own"
            if self.stage:
                if _ends_with_prefetch(dataset):
                    applied["prefetch"] = "the script's own"
                else:
                    out = out.prefetch(self.depth)
                    applied["prefetch"] = self.depth
            with self._lock:
                ds_list = self.keras.setdefault("datasets", [])
                if len(ds_list) < 10:
                    ds_list.append(applied)
            return out
        except Exception as exc:  # never fail the job over an option
            self._error(f"Keras dataset options not applied ({type(exc).__name__}: {exc})")
            return dataset

    # ------------------------------------------------------------------ config_filters
    def filter_config(self, config):
        ConfigProto = self.tf.compat.v1.ConfigProto
        user = _pools.user_thread_settings(config)
        info: Dict[str, Any] = {"user_settings": user}
        if user and not self.override:
            info["applied"] = "user"
            self._add_session_info(info)
            self.note("a session's ConfigProto sets thread options; the script's settings were kept "
                      "(sched_override_user=1 lets rtkit's win)")
            return config
        new = ConfigProto()
        if config is not None:
            new.CopyFrom(config)
        self.plan.apply(new)
        info["applied"] = "rtkit" if not user else "rtkit (override)"
        info["inter_op_threads"] = new.inter_op_parallelism_threads
        info["intra_op_threads"] = new.intra_op_parallelism_threads
        info["pools"] = [{"index": i, "stage": s, "threads": n, "global_name": self.plan.global_name(s, n)}
                         for i, (s, n) in enumerate(self.plan.pools)]
        self._add_session_info(info)
        return new

    def _add_session_info(self, info: Dict) -> None:
        with self._lock:
            if len(self.sessions_info) < 20:
                self.sessions_info.append(info)

    # ------------------------------------------------------------------ analysis and rewrite
    def _state(self, session) -> _SessionState:
        st = self._states.get(session)
        if st is None:
            st = _SessionState(self._rtkit_routed(getattr(session, "_config", None)))
            self._states[session] = st
        return st

    def _graph_state(self, graph) -> _GraphState:
        gs = self._graphs.get(graph)
        if gs is None:
            gs = _GraphState()
            gs.analysis = analyze(graph)
            gs.version = graph.version
            self.last_analysis = gs.analysis
            if self.stage:
                try:
                    gs.staged, gs.reason = rewrite(graph, gs.analysis, self.depth)
                except Exception as exc:  # the graph is left as it was (rewrite adds before it rewires)
                    gs.staged, gs.reason = None, f"rewrite failed ({type(exc).__name__}: {exc})"
                if gs.staged is not None:
                    self.counts["rewrites"] += 1
                    self.last_staged = gs.staged
                    # the rewrite added ops: analyse again so the staging ops are classified too
                    gs.analysis = analyze(graph)
                    self.last_analysis = gs.analysis
                    gs.version = graph.version
                else:
                    self.stage_reason = gs.reason
                    self.note(f"input stage not staged, graph left as it is: {gs.reason}")
            else:
                for n in gs.analysis.notes:
                    self.note(n)
            self._graphs[graph] = gs
        elif gs.version != graph.version:  # the graph grew after the first run: classify the new ops
            gs.analysis = analyze(graph)
            gs.version = graph.version
            self.last_analysis = gs.analysis
        return gs

    def _classify(self, session, st: _SessionState, fetches, feed_dict):
        """-> (signature, mode, connect) with mode in plain | staged | reset | direct; connect: the boundary tensors
        a staged-mode run reads (fetched, or consumed by an op it runs) and does not feed, which a staged step takes
        from the get op."""
        graph = session.graph
        gs = self._graph_state(graph)
        resolved = [graph.as_graph_element(e, allow_tensor=True, allow_operation=True)
                    for e in _leaves(fetches, [])]
        fed = set()
        for key in (feed_dict or {}):
            parts = [key.indices, key.values, key.dense_shape] if hasattr(key, "dense_shape") else [key]
            for p in parts:
                el = graph.as_graph_element(p, allow_tensor=True, allow_operation=False)
                fed.add(el.name)
        sig = tuple(sorted(e.name for e in resolved))
        key = (sig, tuple(sorted(fed)), gs.version)
        hit = st.cache.get(key)
        if hit is not None:
            return sig, hit[0], hit[1]
        sm = gs.analysis
        staged = gs.staged
        fetch_ops = [getattr(e, "op", e) for e in resolved]
        reach = reachable(graph, fetch_ops, fed, stop=sm.pipelined | sm.resets)
        mode, connect = "plain", ()
        if reach & sm.resets:
            mode = "reset"
        elif staged is not None and reach & sm.pipelined:
            bset = set(staged.boundary)
            fetched = {e.name for e in resolved}
            # an input-stage tensor the run reads that is not on the staged boundary (fetched, or read by an op added
            # to the graph after the staging ops) has no staged copy: the run reads the iterator itself
            direct = any(getattr(e, "op", e).name in sm.pipelined and e.name not in bset for e in resolved) or any(
                t.op.name in sm.pipelined and t.name not in bset and t.name not in fed
                for n in reach if n not in sm.pipelined for t in graph.get_operation_by_name(n).inputs)
            need = tuple(sorted(
                b for b in staged.boundary if b not in fed and
                (b in fetched or any(c.name in reach and c.name not in sm.pipelined and c is not staged.put
                                     for c in graph.get_tensor_by_name(b).consumers()))))
            if direct or not need:
                mode = "direct"
            else:
                mode, connect = "staged", need
        st.cache[key] = (mode, connect)
        return sig, mode, connect

    # ------------------------------------------------------------------ run_wrappers / callable_wrappers
    def wrap_run(self, session, run_next, fetches, feed_dict=None, options=None, run_metadata=None):
        if getattr(self._local, "bypass", False):
            return run_next(fetches, feed_dict, options, run_metadata)
        st = self._state(session)
        try:
            sig, mode, connect = self._classify(session, st, fetches, feed_dict)
        except Exception as exc:  # never fail the job over analysis
            self._error(f"run not analysed ({type(exc).__name__}: {exc}); ran unchanged")
            return run_next(fetches, feed_dict, options, run_metadata)

        is_step = sig in self._step_keys   # the step's run shape: known only after the step owner named it once
        tracing = is_step and self._traced_steps < TRACE_STEPS and self.step_runs > WARM_RUNS
        if is_step and not tracing and self.tuner is not None and not self.tuner.done and \
                self._traced_steps >= TRACE_STEPS:
            c, i, stg = self.tuner.current()
            self.active["compute"], self.active["input"], self.active["stage"] = c, i, stg

        opts, md = self._options(st, options, run_metadata, tracing)
        t_begin = time.time()
        state = self._before(session, st, mode, tracing)
        t0 = time.time()
        self._report_before_run(mode, t0 - t_begin)
        self._local.step_ms = None
        if state == "ready":  # a staged batch: the step's consumers read it from the get op
            result = self._run_staged(session, st, fetches, feed_dict, opts, md, connect)
        else:  # everything else, an unstaged step included, is the script's own run of the script's own graph
            try:
                result = run_next(fetches, feed_dict, opts, md)
            except BaseException as exc:
                self._unstaged_failed(state, exc)
                raise
        self._after_run(st, sig, mode, t0, time.time(), tracing, md)
        return result

    def _run_staged(self, session, st: _SessionState, fetches, feed_dict, opts, md, connect: Tuple[str, ...]):
        """The run's fetches as one TF call in which each boundary tensor in `connect` is replaced by the get op's
        output (CallableOptions.tensor_connection): no op of the script's graph is changed, and the consumers
        read the staged batch inside the runtime. One callable per run shape, made at its first staged step."""
        from tensorflow.python.client import session as session_lib  # _FetchHandler: Session.run's own structure code

        graph = session.graph
        staged = self._graphs[graph].staged
        feed_names: List[str] = []
        feed_vals: List[Any] = []
        feed_map: Dict[Any, Any] = {}
        for k, v in (feed_dict or {}).items():
            if hasattr(k, "dense_shape"):  # a SparseTensor key: its three parts
                vals = (v.indices, v.values, v.dense_shape) if hasattr(v, "dense_shape") else tuple(v)
                pairs = list(zip((k.indices, k.values, k.dense_shape), vals))
            else:
                pairs = [(k, v)]
            for kk, vv in pairs:
                t = graph.as_graph_element(kk, allow_tensor=True, allow_operation=False)
                arr = np.asarray(vv, dtype=t.dtype.as_numpy_dtype)
                feed_names.append(t.name)
                feed_vals.append(arr)
                feed_map[t.ref()] = arr
        handler = session_lib._FetchHandler(graph, fetches, feed_map)
        fetch_names = [t.name for t in handler.fetches()]
        target_names = [op.name for op in handler.targets()]
        okey = b""
        if opts is not None:
            # a callable keeps the run options it was made with, and making one costs a Grappler pass and an executor
            # (seconds on wdl): one per run shape, on the pool of its first staged step. Staged candidates all use
            # the first compute size; only the few drained items of a block that turned staging off run there too
            plain = type(opts)()
            plain.CopyFrom(opts)
            plain.inter_op_thread_pool = 0
            okey = plain.SerializeToString(deterministic=True)
        ckey = (tuple(fetch_names), tuple(target_names), tuple(feed_names), connect, okey)
        fn = st.callables.get(ckey)
        if fn is None:
            from tensorflow.core.protobuf import config_pb2  # CallableOptions has no public tf.* name

            co = config_pb2.CallableOptions()
            co.feed.extend(feed_names)
            # a connected tensor cannot be fetched (TF: "both fed and fetched"): its staged value is the get's output
            co.fetch.extend(staged.mapping[n].name if n in connect else n for n in fetch_names)
            co.target.extend(target_names)
            for n in connect:
                c = co.tensor_connection.add()
                c.from_tensor = staged.mapping[n].name
                c.to_tensor = n
            if opts is not None:
                co.run_options.CopyFrom(opts)
            fn = session._make_callable_from_options(co)
            _keep_callable(st, ckey, fn)
        values = self._timed_run(session, fetch_names, target_names, lambda: fn(*feed_vals, run_metadata=md))
        return handler.build_results(session, values)

    def wrap_callable(self, session, make_next, fetches, feed_list=None, accept_options=False):
        """Session.make_callable: the staging ops are added before the callable is made (which extends the
        session's graph); each call of a callable that reads the input is served like a step run: a staged batch
        through the staged callable, otherwise the script's own callable."""
        try:
            st = self._state(session)
            sig, mode, connect = self._classify(session, st, fetches, {k: None for k in (feed_list or ())})
        except Exception as exc:
            self._error(f"callable not analysed ({type(exc).__name__}: {exc}); made unchanged")
            return make_next(fetches, feed_list, accept_options)
        fn = make_next(fetches, feed_list, accept_options)
        if mode not in ("staged", "reset"):
            return fn
        sched = self

        def call(*args, **kwargs):
            if getattr(sched._local, "bypass", False):
                return fn(*args, **kwargs)
            t_begin = time.time()
            state = sched._before(session, st, mode, False)
            t0 = time.time()
            sched._report_before_run(mode, t0 - t_begin)
            sched._local.step_ms = None
            if state == "ready":
                md = kwargs.get("run_metadata")
                opts, md = sched._options(st, kwargs.get("options"), md, False)
                out = sched._run_staged(session, st, fetches, dict(zip(feed_list or (), args)), opts, md, connect)
            else:  # the script's callable; one with a feed list goes through Session.run: not a second step there
                sched._local.bypass = True
                try:
                    out = fn(*args, **kwargs)
                except BaseException as exc:
                    sched._unstaged_failed(state, exc)
                    raise
                finally:
                    sched._local.bypass = False
            sched._after_run(st, sig, mode, t0, time.time(), False, None)
            return out

        call.__wrapped__ = fn
        return call

    def _options(self, st: _SessionState, options, run_metadata, tracing):
        opts, md = options, run_metadata
        if st.routed or tracing:
            RunOptions = self.tf.compat.v1.RunOptions
            opts = RunOptions()
            if options is not None:
                opts.CopyFrom(options)
            if st.routed and not opts.inter_op_thread_pool:
                opts.inter_op_thread_pool = self.plan.index("compute", self.active["compute"])
            if tracing:
                opts.trace_level = RunOptions.SOFTWARE_TRACE
                if md is None:
                    md = self.tf.compat.v1.RunMetadata()
        return opts, md

    def _before(self, session, st: _SessionState, mode: str, tracing: bool) -> Optional[str]:
        """Staging work before a run: stop the runner for an iterator reset; before a run that reads the input,
        take the staged batch ('ready': the run reads it from the get op) or learn that none is staged and none
        will come ('inline': the script's own graph runs and reads the iterator itself, with no extra run), or
        raise the input error of this step. None for runs that do not read the input."""
        if mode == "reset":
            self._stop_runner(st, "iterator reset/save run")
            return None
        if mode == "direct":
            with self._lock:
                self.counts["direct_input_runs"] += 1
            self.note("a run read input-stage tensors that are not staged (an intermediate of the input "
                      "stage): it reads the iterator directly, a batch ahead of the staged ones")
            return None
        if mode != "staged":
            return None
        runner = self._runner(session, st)
        if tracing and self._traced_inputs == 0 and self._input_trace_left == 0:
            self._input_trace_left = TRACE_STEPS
        if self.active["stage"]:
            if not runner.alive and runner.error is None:  # a pending error is raised at its step first
                with self._lock:
                    self._ident += 1
                    ident = self._ident
                    self.counts["runners_started"] += 1
                runner.start(ident)
        elif runner.alive:
            runner.halt()  # unstaged from now on: the items already staged are served first
        try:
            state, put_ms, wait_ms = runner.take()
        except BaseException as exc:
            if self._input_error(exc):
                with self._lock:
                    self.counts["errors_delivered"] += 1
            raise
        self._local.step_kind = "unstaged" if state == "inline" else "staged"
        with self._lock:  # the counts are shared by the steps of every thread and session
            self.counts["input_runs"] += 1
            if state == "inline":
                self.counts["inline_steps"] += 1
            else:
                self.counts["staged_steps"] += 1
                if len(self._overlap) < MAX_SAMPLES:
                    hidden = 100.0 * max(0.0, put_ms - wait_ms) / put_ms if put_ms > 0 else 100.0
                    self._overlap.append([self.step_runs, round(put_ms, 3), round(wait_ms, 3), round(hidden, 1)])
        if self.active["stage"] and runner.depth_samples and len(self._depth) < MAX_SAMPLES:
            t, d = runner.depth_samples[-1]
            self._depth.append([round(t, 4), d])
        if len(runner.depth_samples) > 64:
            del runner.depth_samples[:-1]
        return state

    def _input_error(self, exc: BaseException) -> bool:
        """Whether a step's error comes from the input (the end of the data, a bad or corrupt record): one that a
        staged step delivers at its step. An interrupt (KeyboardInterrupt) or the script's own mistake (a feed of
        the wrong shape: ValueError before TF runs) is not."""
        errors = self.tf.errors
        return isinstance(exc, (errors.OutOfRangeError, errors.InvalidArgumentError, errors.DataLossError))

    def _unstaged_failed(self, state: Optional[str], exc: BaseException) -> None:
        """An unstaged step's own run raised: not a step. An input error is delivered at its step, as a staged
        step's is; an interrupt or the script's own mistake is not an input error."""
        if state == "inline":
            with self._lock:
                self.counts["inline_steps"] -= 1
                self.counts["input_runs"] -= 1
                if self._input_error(exc):
                    self.counts["errors_delivered"] += 1

    def _report_before_run(self, mode: str, seconds: float) -> None:
        if mode == "staged" and self._before_run is not None and seconds > 0:
            try:
                self._before_run(seconds * 1000.0)
            except Exception as exc:  # only the step's timing is affected
                self._error(f"step timing not told of the staging wait ({type(exc).__name__}: {exc})")

    def on_step(self, signature: str, ms: float) -> None:
        """The step owner's word that a training step (of any API) just ended on this thread, `ms` long (what the
        script waited for, a staged batch's wait included). A change of step signature (the train op overtaking
        reads a hook made at session creation) discards what was measured on the earlier one."""
        switched_from = None
        with self._lock:
            if signature != self.step_signature:
                if self.step_signature is not None:
                    switched_from = (self.step_signature, self.step_runs)
                    self.step_ms = []
                    self._traced_steps = 0
                    self.stage_cost_ms = {k: 0.0 for k in self.stage_cost_ms}
                    self.tuner = self._new_tuner()
                    self.active.update(compute=self.plan.compute_sizes[0], input=self.plan.input_sizes[0],
                                       stage=self.stage and self.tuner is None)
                self.step_signature = signature
                self.step_runs = 0
                self._step_keys = set()
            self.step_runs += 1
        self._local.step_ms = float(ms)
        if switched_from is not None and switched_from[1] >= WARM_RUNS:  # self.note takes the lock
            self.note(f"the step is the run of {signature[:120]}, not the earlier {switched_from[0][:80]} "
                      f"({switched_from[1]} runs: a hook's read)")

    def _after_run(self, st: _SessionState, key: tuple, mode: str, t0: float, t1: float, tracing: bool,
                   md) -> None:
        """After one of the runs this scheduler wraps: when the step owner called it the step (on_step on this
        thread, during the run), the step's part: t0..t1 is TF's run, the step's time is on_step's."""
        ms = getattr(self._local, "step_ms", None)
        self._local.step_ms = None
        if ms is None:
            return
        with self._lock:
            if len(self._step_keys) >= MAX_STEP_KEYS:
                self._step_keys.clear()
            self._step_keys.add(key)
        kind = getattr(self._local, "step_kind", None) if mode == "staged" else mode
        self.trace.add("steps", "step", t0 * 1e6, (t1 - t0) * 1e6, {"mode": kind or mode})
        if tracing:
            self._traced_steps += 1
            self._take_stats(md, st, "step")
            return
        self.step_ms.append(ms)
        if self.tuner is not None and self._traced_steps >= TRACE_STEPS and not self.tuner.done:
            self.tuner.record(ms)
            if self.tuner.done:
                self._tuning_finished()
        if self.settings.get("sched_pin") and self.pin_result is None and \
                (self.tuner is None or self.tuner.done) and st.routed:
            total = sum(self.stage_cost_ms.values())
            share = self.stage_cost_ms["input"] / total if total else None
            self.pin_result = _pools.pin_pools(self.plan, {
                "compute": self.plan.index("compute", self.active["compute"]),
                "input": self.plan.index("input", self.active["input"])}, share)

    def _take_stats(self, md, st: _SessionState, label: str, input_run: bool = False, stage_of=None) -> None:
        if md is None or self.last_analysis is None:
            return
        cost = self.trace.add_step_stats(md.step_stats, stage_of or self.last_analysis.stage, label)
        with self._lock:
            for k, v in cost.items():
                self.stage_cost_ms[k] += v
            if input_run:
                self._traced_inputs += 1
                self.input_run_cost_ms += sum(cost.values())

    # ------------------------------------------------------------------ the runner
    def _runner(self, session, st: _SessionState) -> Runner:
        with st.lock:
            if st.runner is None:
                gs = self._graphs[session.graph]
                ref = weakref.ref(session)
                clear = gs.staged.clear

                def run_clear():
                    sess = ref()
                    if sess is not None and not getattr(sess, "_closed", False):
                        self._run_internal(sess, clear, None, None)

                st.runner = Runner(self._make_put(session, st), run_clear, self._runner_event,
                                   depth=self.depth)
                self._runners.add(st.runner)
            return st.runner

    def _run_internal(self, sess, fetch, opts, md):
        self._local.bypass = True
        try:
            with self._internal():  # rtkit's own run: not a step in the hooks' step timing
                return sess.run(fetch, options=opts, run_metadata=md)
        finally:
            self._local.bypass = False

    def _make_put(self, session, st: _SessionState):
        RunOptions = self.tf.compat.v1.RunOptions
        RunMetadata = self.tf.compat.v1.RunMetadata
        ref = weakref.ref(session)
        put = self._graphs[session.graph].staged.put

        def run_put():
            sess = ref()
            if sess is None:
                raise RuntimeError("rtkit scheduler: the session was garbage-collected")
            opts = RunOptions()
            if st.routed:
                opts.inter_op_thread_pool = self.plan.index("input", self.active["input"])
            md = None
            if self._input_trace_left > 0:
                self._input_trace_left -= 1
                opts.trace_level = RunOptions.SOFTWARE_TRACE
                md = RunMetadata()
            self._run_internal(sess, put, opts, md)
            del sess
            if md is not None:
                self._take_stats(md, st, "put", input_run=True)
        return run_put

    def _runner_event(self, kind: str, t0: float, t1: float, args: Dict) -> None:
        track = "stage-put" if kind == "put" else "stage-wait"
        self.trace.add(track, kind, t0 * 1e6, (t1 - t0) * 1e6, args)

    def _stop_runner(self, st: _SessionState, why: str, timeout_s: float = 30.0) -> None:
        runner = st.runner
        if runner is None:
            return
        dropped = runner.stop(timeout_s)
        self.counts["dropped_items"] += dropped
        if dropped and why not in ("session close", "exit"):  # at close, staged-ahead batches are expected
            self.note(f"staging stopped ({why}): {dropped} staged batch(es) dropped")

    # ------------------------------------------------------------------ close / exit
    def on_close(self, session) -> None:
        st = self._states.get(session)
        if st is not None:
            self._stop_runner(st, "session close")

    def stop_all(self, timeout_s: float = 30.0) -> None:
        for st in list(self._states.values()):
            if st.runner is not None and st.runner.alive:
                self._stop_runner(st, "exit", timeout_s)

    def _tuning_finished(self) -> None:
        c, i, stg = self.tuner.chosen
        self.active["compute"], self.active["input"], self.active["stage"] = c, i, stg
        values = {"sched": True, "sched_stage": stg, "sched_stage_depth": self.depth,
                  "sched_inter_op": c, "sched_intra_op": self.plan.intra_op, "sched_input_threads": i,
                  "sched_tune": False}
        desc = f"Tuned by the rtkit scheduler on {now_iso()} ({_pools.cpu_count()} CPUs)"
        targets = []
        if self.run_dir:
            targets.append(os.path.join(self.run_dir, "scheduler-profile.toml"))
        if self.settings.get("sched_save_profile"):
            targets.append(str(self.settings["sched_save_profile"]))
        for path in targets:
            err = write_profile(path, values, desc)
            if err:
                self.note(err)
            else:
                self.profile_written.append(path)

    def state_line(self) -> str:
        """What actually happened, in one line (the run summary shows it)."""
        c = self.counts
        parts = []
        if not self.stage:
            parts.append("staging off")
        elif c["rewrites"] == 0:
            parts.append("not staged" + (f" ({self.stage_reason})" if self.stage_reason else
                                         " (no session graph ran)"))
        elif c["staged_steps"] == 0 and c["inline_steps"]:
            parts.append(f"staging off: the script's own graph ran ({c['inline_steps']} steps), "
                         "0 extra runs per step")
        else:
            parts.append(f"in-graph staging: {c['staged_steps']} of {c['input_runs']} input-reading runs staged")
            if c["inline_steps"]:
                parts.append(f"{c['inline_steps']} unstaged: the script's own graph ran, 0 extra runs per step")
        if self.keras.get("datasets"):
            parts.append(f"stage options on {len(self.keras['datasets'])} tf.data input(s) (Keras fit or an eager loop)")
        if self.tuner is not None:
            t = self.tuner.report()
            if not t["done"]:
                parts.append(f"tuning not finished ({t['steps_used']} of {t['budget_steps']} steps)")
            else:
                parts.append("tuned: " + t["verdict"])
        if self.errors:
            parts.append(f"{len(self.errors)} error(s): {self.errors[0][:80]}")
        return "on, " + ", ".join(parts)

    def report(self) -> Dict[str, Any]:
        sm = self.last_analysis
        n_traced = max(1, self._traced_steps)
        stages = {}
        counts = sm.counts() if sm else {s: 0 for s in STAGES}
        total_ms = sum(self.stage_cost_ms.values()) or 0.0
        for s in STAGES:
            ms = self.stage_cost_ms[s] / n_traced if self._traced_steps else None
            stages[s] = {"ops": counts[s], "op_time_ms_per_step": ms,
                         "share_pct": (100.0 * self.stage_cost_ms[s] / total_ms) if total_ms else None}
        tuning = self.tuner.report() if self.tuner else None
        med = statistics.median(self.step_ms) if self.step_ms else None
        if tuning is not None:
            # what the slower trials cost, as a share of this job's step time (the report's steps, traced ones
            # left out, as the tuner never sees them)
            extra = tuning["overhead_vs_chosen_ms"]
            tuning["cost_pct_of_job"] = (round(100.0 * extra / sum(self.step_ms), 2)
                                         if self.step_ms and extra is not None else None)
        staged = self.last_staged
        depths = [d for _, d in self._depth]
        hidden = [o[3] for o in self._overlap]
        return {
            "schema_version": 2,
            "pid": os.getpid(),
            "state": self.state_line(),
            "settings": {k: v for k, v in self.settings.items() if k.startswith("sched")},
            "sessions": self.sessions_info,
            "keras": self.keras,
            "stages": stages,
            "stage_cost_source": f"RunMetadata step_stats of {self._traced_steps} traced step(s) and "
                                 f"{self._traced_inputs} traced put run(s); op time summed per stage",
            "input_share_pct": stages["input"]["share_pct"],
            "step_signature": self.step_signature,
            "steps_seen": self.step_runs,
            "step_ms_median": med,
            "chosen": {"compute_threads": self.active["compute"], "input_threads": self.active["input"],
                       "intra_op_threads": self.plan.intra_op, "stage_pipelined": self.active["stage"],
                       "stage_depth_steps": self.depth if self.active["stage"] else 0},
            "tuning": tuning,
            "speedup_over_first_x": tuning["speedup_over_first_x"] if tuning else None,
            "pipeline": {
                "enabled": self.stage,
                "mechanism": "in-graph StagingArea (put ahead on the input pool; a staged step reads the get "
                             "through CallableOptions.tensor_connection, the script's graph is not rewired)",
                "unstaged_step": "the script's own fetches on the script's own graph: one TF call, no put",
                "staged": staged is not None,
                "not_staged_reason": self.stage_reason,
                "cuttable": bool(sm and sm.cuttable),
                "depth_steps": self.depth,
                "boundary_tensors": list(staged.boundary) if staged else (list(sm.boundary) if sm else []),
                "connected_inputs": staged.connected if staged else 0,
                "pipelined_ops": len(sm.pipelined) if sm else 0,
                "pipelines_started": self.counts["runners_started"],
                "input_runs": self.counts["input_runs"],
                "staged_steps": self.counts["staged_steps"],
                "inline_steps": self.counts["inline_steps"],
                "unstaged_steps": self.counts["inline_steps"],
                "dropped_batches": self.counts["dropped_items"],
                "errors_delivered": self.counts["errors_delivered"],
                "direct_input_runs": self.counts["direct_input_runs"],
                "queue_depth_samples": self._depth,
                "occupancy_samples_batches": depths,
                "occupancy_mean_batches": (sum(depths) / len(depths)) if depths else None,
                "steps_waited_pct": (100.0 * sum(1 for d in depths if d == 0) / len(depths)) if depths else None,
                "overlap_samples": self._overlap,
                "overlap_columns": ["step", "put_ms", "wait_ms", "hidden_pct"],
                "input_hidden_pct_median": statistics.median(hidden) if hidden else None,
            },
            "pinning": self.pin_result,
            "profiles_written": self.profile_written,
            "errors": self.errors,
            "notes": self.notes,
        }

    def at_exit(self) -> None:
        if self._finished:
            return
        self._finished = True
        # never hold the process: a runner blocked in a long input run is a daemon and is abandoned
        self.stop_all(timeout_s=1.0)
        if self.run_dir:
            try:
                write_report(self.run_dir, self.report(), self.trace.chrome())
            except OSError as exc:
                self.note(f"cannot write the scheduler report: {exc}")
