# pipeline.py -- the staging side of the Scheduler: graph analysis, the in-graph rewrite, staged runs and runners.
"""A run is classified once per run shape (plain, staged, reset, direct); a staged run takes its batch from a
Runner that puts ahead on the input pool, and its consumers read the batch through a callable's tensor
connections, so no op of the script's graph is rewired."""
from __future__ import annotations

import threading
import time
import weakref
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from . import lookahead_graph, lookahead_pages
from .lookahead import Lookahead
from .lookahead_feeds import FedLookahead, fed_values
from .measure import TRACE_STEPS
from .stages import StageMap, analyze, reachable
from .staging import ReadAhead, Runner, Staged, rewrite

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


class _GraphState:
    """One rewrite per graph, at the first run (or make_callable) any session makes on it: a session only
    sees an edge change if it has not run the consumer yet."""

    def __init__(self):
        self.analysis: Optional[StageMap] = None
        self.staged: Optional[Staged] = None
        self.reason: Optional[str] = None
        self.version = -1
        self.lookahead = None        # lookahead_graph.Plan: the rows each staged batch gathers
        self.feed_plan = None        # lookahead_graph.Plan of a graph whose steps feed their ids (not staged)


class _SessionState:
    def __init__(self, routed: bool):
        self.routed = routed
        self.cache: Dict[Any, tuple] = {}
        self.callables: Dict[tuple, Any] = {}   # the staged step's callables (tensor connections), per run shape
        self.runner: Optional[Runner] = None
        self.lookahead: Optional[Lookahead] = None
        self.fed: Optional[FedLookahead] = None
        self.lock = threading.Lock()


def _alive(ref):
    """The session of a weak reference, for a run of the pipeline's own."""
    sess = ref()
    if sess is None:
        raise RuntimeError("rtkit scheduler: the session was garbage-collected")
    return sess


def _keep_callable(st: _SessionState, key: tuple, fn) -> None:
    """Keep a staged callable for its run shape; past MAX_CALLABLES (run shapes that never repeat) the oldest
    goes (dict order). Under the session's lock: two threads' steps evicting at once would both pick the same
    oldest key, and the second one's KeyError would surface in the user's Session.run."""
    with st.lock:
        if len(st.callables) >= MAX_CALLABLES:
            st.callables.pop(next(iter(st.callables)), None)
        st.callables[key] = fn


class Pipeline:
    """Mixed into Scheduler: per-graph analysis and rewrite, per-session staging state, the pipeline's counts."""

    def _init_pipeline(self, settings: Dict[str, Any]) -> None:
        self.stage = bool(settings.get("sched_stage"))
        self.depth = int(settings.get("sched_stage_depth") or 2)
        self.read_ahead = int(settings.get("sched_stage_read_ahead") or 0)
        self._graphs: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
        self._plan_lock = threading.Lock()
        self._states: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
        self._runners: "weakref.WeakSet" = weakref.WeakSet()
        self.last_analysis: Optional[StageMap] = None
        self.last_staged: Optional[Staged] = None
        self.stage_reason: Optional[str] = None
        self.counts = {"runners_started": 0, "staged_steps": 0, "inline_steps": 0, "dropped_items": 0,
                       "errors_delivered": 0, "direct_input_runs": 0, "rewrites": 0, "input_runs": 0,
                       "probe_steps": 0, "read_ahead_batches": 0}
        self._depth: List[List[float]] = []      # [t, items staged] when a step took its item
        self._overlap: List[List[float]] = []    # [step, put ms, wait ms, hidden %]
        self._ident = 0
        self._init_lookahead(settings)

    def _init_lookahead(self, settings: Dict[str, Any]) -> None:
        """The lookahead's mode ("on", "measure") or None with the reason it is off."""
        want = str(settings.get("sched_lookahead") or "auto")
        self.lookahead_max_rows = int(settings.get("sched_lookahead_max_rows") or (1 << 20))
        self.lookahead_wait_s = int(settings.get("sched_lookahead_wait_ms") or 0) / 1000.0
        self.lookahead_pool = str(settings.get("tier_pool_path") or "")
        self.lookahead_mode: Optional[str] = None
        self.lookahead_reason: Optional[str] = None
        self.lookahead_rows_from = "staged batch"
        self._lookaheads: List[Lookahead] = []
        # a graph that feeds its ids needs no staging: the step's own feeds give its rows
        self.lookahead_feeds_mode: Optional[str] = None
        if want != "off" and (want != "auto" or self.lookahead_pool):
            self.lookahead_feeds_mode = "measure" if want == "measure" else "on"
        if want == "off":
            self.lookahead_reason = "sched_lookahead=off"
        elif self.lookahead_only:
            self.lookahead_reason = "no session run fed the ids of a table gather"
        elif not self.stage:
            self.lookahead_reason = "staging is off (sched_stage=0): there is no next batch to look at"
        elif want == "auto" and not self.lookahead_pool:
            self.lookahead_reason = "auto: not in tier mode (no tier_pool_path): the tables are in DRAM"
        else:
            self.lookahead_mode = "measure" if want == "measure" else "on"

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
                    self._plan_lookahead(graph, gs)
                    # the rewrite added ops: analyse again so the staging ops are classified too
                    gs.analysis = analyze(graph)
                    self.last_analysis = gs.analysis
                    gs.version = graph.version
                else:
                    self.stage_reason = gs.reason
                    if self.lookahead_mode is not None:
                        self.lookahead_mode, self.lookahead_reason = None, f"the input stage is not staged ({gs.reason})"
                    self.note(f"input stage not staged, graph left as it is: {gs.reason}")
            else:
                for n in gs.analysis.notes:
                    self.note(n)
            if gs.staged is None and self._plan_feed_lookahead(graph, gs):
                gs.analysis = analyze(graph)   # the plan added its copy and touch ops
                gs.version = graph.version
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

        tracing = self._before_step_run(sig)
        opts, md = self._options(st, options, run_metadata, tracing)
        t_begin = time.time()
        state = self._before(session, st, mode, tracing)
        fed = mode == "plain" and bool(feed_dict) and self._graphs[session.graph].feed_plan is not None
        if fed:
            self._fed_rows(session, st, sig, feed_dict)
        t0 = time.time()
        self._report_before_run(mode == "staged" or fed, t0 - t_begin)
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
            sched._local.probe_ok = False
            state = sched._before(session, st, mode, False)
            t0 = time.time()
            sched._report_before_run(mode == "staged", t0 - t_begin)
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

    def _before(self, session, st: _SessionState, mode: str, tracing: bool) -> Optional[str]:
        """Staging work before a run: stop the runner for an iterator reset; before a run that reads the input,
        take the staged batch ('ready': the run reads it from the get op) or learn that none is staged and none
        will come ('inline': the script's own graph runs and reads the iterator itself, with no extra run), or
        raise the input error of this step. None for runs that do not read the input. A probe step (the tuner's
        measurement of the unstaged step's parts, measure.py) runs its put here, alone, then its compute alone."""
        self._local.probe = None
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
        probing = getattr(self._local, "probe_ok", False)
        self._local.probe_ok = False
        if tracing and self._traced_inputs == 0 and self._input_trace_left == 0:
            self._input_trace_left = TRACE_STEPS
        ra = runner.read_ahead
        if self.active["stage"] and not probing:
            if ra is not None:
                ra.on = bool(self.active.get("read_ahead"))
            if not runner.alive and runner.error is None:  # a pending error is raised at its step first
                with self._lock:
                    self._ident += 1
                    ident = self._ident
                    self.counts["runners_started"] += 1
                runner.start(ident)
            if ra is not None:
                if ra.on and not ra.alive and ra.error is None:
                    ra.start(self._ident)
                elif not ra.on:
                    ra.halt()   # what it read is decoded first
        elif runner.alive:
            runner.halt()  # unstaged from now on (or for the probe steps): the items already staged are served first
        if probing:
            runner.wait_item()
        try:
            if probing and not runner.alive and runner.error is None and runner.puts == runner.gets and \
                    (ra is None or (not ra.alive and not ra.pending())):
                self._local.probe = self._probe_put(runner)
            state, put_ms, wait_ms = runner.take()
        except BaseException as exc:
            if self._input_error(exc):
                with self._lock:
                    self.counts["errors_delivered"] += 1
            raise
        if getattr(self._local, "probe", None) is not None:  # the step waited for all of its put: none hidden
            wait_ms += self._local.probe[0]
            with self._lock:
                self.counts["probe_steps"] += 1
        self._local.step_kind = "unstaged" if state == "inline" else "staged"
        if state == "ready" and st.lookahead is not None:
            st.lookahead.on_take()
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

    def _probe_put(self, runner: Runner) -> Tuple[float, float]:
        """The probe step's put, alone in the caller's thread and on the compute pool, where the unstaged step
        runs the same ops (the input pool may have fewer threads: the bound's input + compute is then the unstaged
        step's time, not more): (its wall ms, the process's CPU ms meanwhile: nothing else of the job runs, so a
        put far shorter in CPU than in wall time is waiting, e.g. on a read)."""
        c0 = time.process_time()
        put_ms = runner.put_now(stage="compute")
        return put_ms, (time.process_time() - c0) * 1000.0

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

    def _report_before_run(self, part_of_step: bool, seconds: float) -> None:
        """Time spent for the run before TF's call (a staged batch's wait, the lookahead of fed rows) is its step's."""
        if part_of_step and self._before_run is not None and seconds > 0:
            try:
                self._before_run(seconds * 1000.0)
            except Exception as exc:  # only the step's timing is affected
                self._error(f"step timing not told of the staging wait ({type(exc).__name__}: {exc})")
    # ------------------------------------------------------------------ the runner
    def _runner(self, session, st: _SessionState) -> Runner:
        with st.lock:
            if st.runner is None:
                gs = self._graphs[session.graph]
                run_clear = self._clear_of(session, gs.staged.clear)
                ra = None
                if self.read_ahead > 0 and gs.staged.read_put is not None:
                    ra = ReadAhead(self._make_read(session, st), self._make_decode(session, st),
                                   self._clear_of(session, gs.staged.read_clear), self.read_ahead)
                if gs.lookahead is not None and self.lookahead_mode is not None and st.lookahead is None:
                    with self._lock:
                        n = len(self._lookaheads) + 1
                    st.lookahead = Lookahead(gs.lookahead, self.lookahead_mode, self.lookahead_max_rows,
                                             self.lookahead_pool, self._make_touch(session, gs.lookahead),
                                             f"rtkit-lookahead-{n}", wait_s=self.lookahead_wait_s)
                    with self._lock:
                        self._lookaheads.append(st.lookahead)
                st.runner = Runner(self._make_put(session, st), run_clear, self._runner_event,
                                   depth=self.depth, read_ahead=ra)
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
        plan = self._graphs[session.graph].lookahead

        def run_put(stage: str = "input"):
            sess = _alive(ref)
            opts = self._input_options(st, stage)
            md = None
            if self._input_trace_left > 0:
                self._input_trace_left -= 1
                opts.trace_level = RunOptions.SOFTWARE_TRACE
                md = RunMetadata()
            la = st.lookahead
            if la is not None and la.wants_rows():   # the batch's rows, from the same boundary tensors in the same run
                out = self._run_internal(sess, [put] + plan.index_tensors, opts, md)
                la.on_put(out[1:])
            else:
                self._run_internal(sess, put, opts, md)
                if la is not None:
                    la.on_put_unlooked()
            del sess
            if md is not None:
                self._take_stats(md, st, "put", input_run=True)
        return run_put

    def _input_options(self, st: _SessionState, stage: str = "input"):
        """Run options of an input-stage run: on the active pool of `stage` (the input pool; the compute pool for
        a probe's put, as the unstaged step runs it)."""
        opts = self.tf.compat.v1.RunOptions()
        if st.routed:
            opts.inter_op_thread_pool = self.plan.index(stage, self.active[stage])
        return opts

    def _clear_of(self, session, clear):
        ref = weakref.ref(session)

        def run_clear():
            sess = ref()
            if sess is not None and not getattr(sess, "_closed", False):
                self._run_internal(sess, clear, None, None)
        return run_clear

    def _make_read(self, session, st: _SessionState):
        """The reader's run: get_next's outputs into the read area (the iterator's next batch, nothing parsed)."""
        ref = weakref.ref(session)
        read_put = self._graphs[session.graph].staged.read_put

        def run_read():
            self._run_internal(_alive(ref), read_put, self._input_options(st), None)
            with self._lock:
                self.counts["read_ahead_batches"] += 1
        return run_read

    def _make_decode(self, session, st: _SessionState):
        """The decoder's run: the cut's put, its get_next outputs connected to the read area's get
        (CallableOptions.tensor_connection, as a staged step reads the staging area): one callable, made at the
        first decode on the input pool then applied."""
        ref = weakref.ref(session)
        staged = self._graphs[session.graph].staged
        made: Dict[str, Any] = {}

        def prepare():
            sess = _alive(ref)
            if made.get("fn") is None:
                from tensorflow.core.protobuf import config_pb2  # CallableOptions has no public tf.* name

                co = config_pb2.CallableOptions()
                co.target.append(staged.put.name)
                if st.lookahead is not None:
                    co.fetch.extend(t.name for t in self._graphs[session.graph].lookahead.index_tensors)
                for to, frm in staged.read_mapping.items():
                    c = co.tensor_connection.add()
                    c.from_tensor = frm.name
                    c.to_tensor = to
                co.run_options.CopyFrom(self._input_options(st))
                made["fn"] = sess._make_callable_from_options(co)
            return made["fn"]

        def run_decode():
            fn = prepare()
            self._local.bypass = True
            try:
                with self._internal():
                    out = fn()
                # one callable (its fetches fixed): the rows come with every batch, looked at or not
                if st.lookahead is not None:
                    if st.lookahead.wants_rows():
                        st.lookahead.on_put(out)
                    else:
                        st.lookahead.on_put_unlooked()
            finally:
                self._local.bypass = False
        run_decode.prepare = prepare
        return run_decode

    def _runner_event(self, kind: str, t0: float, t1: float, args: Dict) -> None:
        track = "stage-put" if kind == "put" else "stage-wait"
        self.trace.add(track, kind, t0 * 1e6, (t1 - t0) * 1e6, args)

    def _stop_runner(self, st: _SessionState, why: str, timeout_s: float = 30.0) -> None:
        runner = st.runner
        if runner is None:
            return
        dropped = runner.stop(timeout_s)
        if st.lookahead is not None:
            st.lookahead.clear()
        self.counts["dropped_items"] += dropped
        if dropped and why not in ("session close", "exit"):  # at close, staged-ahead batches are expected
            self.note(f"staging stopped ({why}): {dropped} staged batch(es) dropped")

    # ------------------------------------------------------------------ close / exit
    def on_close(self, session) -> None:
        st = self._states.get(session)
        if st is not None:
            self._stop_runner(st, "session close")
            if st.lookahead is not None:
                st.lookahead.stop()

    def stop_all(self, timeout_s: float = 30.0) -> None:
        for st in list(self._states.values()):
            if st.runner is not None and st.runner.alive:
                self._stop_runner(st, "exit", timeout_s)
            if st.lookahead is not None:
                st.lookahead.stop()

    # ------------------------------------------------------------------ the lookahead
    def _plan_lookahead(self, graph, gs: _GraphState) -> None:
        """Copy the staged graph's table gathers' index computation (read-only), or say why the lookahead is off."""
        if self.lookahead_mode is None:
            return
        try:
            gs.lookahead, why = lookahead_graph.plan(graph, gs.staged, gs.analysis)
        except Exception as exc:   # the job runs without it
            gs.lookahead, why = None, f"the graph could not be analysed ({type(exc).__name__}: {exc})"
        if gs.lookahead is None:
            self.lookahead_mode, self.lookahead_reason = None, why
            self.note(f"lookahead off: {why}")

    def _plan_feed_lookahead(self, graph, gs: _GraphState) -> bool:
        """A graph not staged whose table gathers read fed ids: the plan of its fed rows (the lookahead then runs
        on each step's feeds), or the staged lookahead's reason stands. Whether a plan was made (it adds ops)."""
        if self.lookahead_feeds_mode is None:
            return False
        try:
            gs.feed_plan, why = lookahead_graph.plan_feeds(graph)
        except Exception as exc:   # the job runs without it
            gs.feed_plan, why = None, f"the graph could not be analysed ({type(exc).__name__}: {exc})"
        if gs.feed_plan is None:
            if self.lookahead_mode is None and self.lookahead_only:   # fed ids are all it looks at
                self.lookahead_reason = f"no table rows from the runs' feeds: {why}"
            elif self.lookahead_mode is None and "nor from feeds" not in (self.lookahead_reason or ""):
                self.lookahead_reason = f"{self.lookahead_reason}; nor from feeds: {why}"   # said once
            return False
        self.lookahead_mode, self.lookahead_reason = self.lookahead_feeds_mode, None
        self.lookahead_rows_from = "feeds"
        return True

    def wrap_fed_run(self, session, run_next, fetches, feed_dict=None, options=None, run_metadata=None):
        """The run wrapper of the lookahead alone (feeds_only.py: the scheduler off, tier mode): before a run that
        feeds the ids of a table gather, those rows' pages are asked for; then the script's own run, as it is (no
        classification, routing, tracing or staging). Runs without feeds pass straight through."""
        if feed_dict and not getattr(self._local, "bypass", False):
            t0 = time.time()
            try:
                graph = session.graph
                gs = self._graphs.get(graph)
                if gs is None:   # planned at the graph's first fed run, as _graph_state does with the scheduler on
                    with self._plan_lock:   # two threads' first runs would each add a copy of the ops
                        gs = self._graphs.get(graph)
                        if gs is None:
                            gs = _GraphState()
                            self._plan_feed_lookahead(graph, gs)
                            self._graphs[graph] = gs
                if gs.feed_plan is not None:
                    sig = tuple(sorted(graph.as_graph_element(e, allow_tensor=True, allow_operation=True).name
                                       for e in _leaves(fetches, [])))
                    self._fed_rows(session, self._state(session), sig, feed_dict)
                    self._report_before_run(True, time.time() - t0)
            except Exception as exc:   # never fail the job over the lookahead
                self._error(f"lookahead of fed rows skipped ({type(exc).__name__}: {exc})")
        return run_next(fetches, feed_dict, options, run_metadata)

    def _fed_rows(self, session, st: _SessionState, sig, feed_dict) -> None:
        """Before a run that gathers fed rows of a table: those rows' pages to the lookahead (never fails the run)."""
        try:
            graph = session.graph
            plan = self._graphs[graph].feed_plan
            if st.fed is None:
                la = Lookahead(plan, self.lookahead_feeds_mode, self.lookahead_max_rows, self.lookahead_pool,
                               self._make_touch(session, plan), None)
                ref = weakref.ref(session)
                st.fed = FedLookahead(plan, la, lambda ts, feed: self._run_feed(_alive(ref), ts, feed))
                with self._lock:
                    self._lookaheads.append(la)
            values = fed_values(graph, feed_dict)
            fed = tuple(sorted(values))

            def reach():   # once per run shape: applies() caches what it finds
                fetch_ops = [getattr(e, "op", e) for e in
                             (graph.as_graph_element(x, allow_tensor=True, allow_operation=True) for x in sig)]
                return reachable(graph, fetch_ops, set(fed), set())
            which = st.fed.applies((sig, fed), fed, reach)
            if which:
                st.fed.before_step(which, values)
        except Exception as exc:
            self._error(f"lookahead of fed rows skipped ({type(exc).__name__}: {exc})")

    def _make_touch(self, session, plan):
        """(rows per table, fetch, regions) -> each table's values [table, slots...] when fetched: a ResourceGather of
        those rows of the table and its slots (only the regions listed per table, when given), run on the input pool
        as rtkit's own run. Reads the pages, writes nothing."""
        ref = weakref.ref(session)

        def run_touch(rows: Dict[str, np.ndarray], fetch: bool, regions: Optional[Dict[str, List[int]]] = None):
            names = [n for n in rows if rows[n].size]
            feed = {plan.touch_feeds[n]: rows[n] for n in names}
            ops = [[o for i, o in enumerate(plan.touch_ops[n]) if regions is None or i in regions[n]] for n in names]
            fetches = [[o.outputs[0] for o in x] for x in ops] if fetch else [o for x in ops for o in x]
            out = self._run_internal(_alive(ref), fetches, None, None) if not feed else \
                self._run_feed(_alive(ref), fetches, feed)
            return dict(zip(names, out)) if fetch else {}
        return run_touch

    def _run_feed(self, sess, fetches, feed):
        self._local.bypass = True
        try:
            with self._internal():
                return sess.run(fetches, feed_dict=feed)
        finally:
            self._local.bypass = False

    def lookahead_report(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"state": "on" if self.lookahead_mode else "off", "mode": self.lookahead_mode,
                               "off_reason": self.lookahead_reason, "max_rows": self.lookahead_max_rows}
        out["rows_from"] = self.lookahead_rows_from
        plans = [p for gs in list(self._graphs.values()) for p in (gs.lookahead, gs.feed_plan) if p is not None]
        if plans:
            out["gathers"] = len(plans[-1].index_tensors)
            out["tables"] = len(plans[-1].tables)
            out["gathers_skipped"] = plans[-1].skipped[:10]
        total: Dict[str, Any] = {}
        for la in self._lookaheads:
            for k, v in la.report().items():
                if isinstance(v, bool) or not isinstance(v, (int, float)):
                    total.setdefault(k, v)
                else:
                    total[k] = total.get(k, 0) + v
        if total:
            if total.get("pages_checked"):
                total["resident_share"] = round(total["pages_resident"] / total["pages_checked"], 4)
            total["worker_cpu_s"] = round(total.get("worker_cpu_s", 0.0), 4)
            total["before_s"] = round(total.get("before_s", 0.0), 4)
            out.update(total)
        if self.lookahead_mode == "on":
            # the tier budget's counts are the process's (every session's lookahead), taken once
            counts = lookahead_pages.budget_counts()
            out["budget_pages_kept"] = counts[1] if counts else None
            out["budget_pages_dropped"] = counts[2] if counts else None
        return out
