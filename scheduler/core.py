# core.py -- the Scheduler: session config filter, per-run routing/pipelining/tracing/tuning, close and exit handling.
"""rtkit's hooks register these methods at their extension points: filter_config (config_filters),
wrap_run (run_wrappers), on_close (close_callbacks), at_exit (exit_callbacks). Each method is also callable directly, which is how the
tests drive it before/without the hooks."""
from __future__ import annotations

import contextlib
import os
import statistics
import threading
import time
import weakref
from typing import Any, Callable, ContextManager, Dict, List, Optional

from . import pools as _pools
from .pipeline import Pipeline
from .report import now_iso, write_profile, write_report
from .stages import STAGES, StageMap, analyze, reachable
from .trace import Trace
from .tuner import Tuner

TRACE_STEPS = 3          # step runs traced (SOFTWARE_TRACE: step stats without a profiler session, which FULL_TRACE would start and which two concurrent runs cannot share) to measure per-stage cost
WARM_RUNS = 3            # runs of a signature before it counts as the step and tracing starts
MAX_NOTES = 50


class _SessionState:
    def __init__(self, routed: bool):
        self.routed = routed
        self.analysis: Optional[StageMap] = None
        self.version = -1
        self.pipeline: Optional[Pipeline] = None
        self.stage_disabled = False
        self.cache: Dict[Any, tuple] = {}
        self.pipelined_runs = 0
        self.lock = threading.Lock()


class Scheduler:
    def __init__(self, tf, settings: Dict[str, Any], run_dir: Optional[str],
                 internal: Callable[[], ContextManager] = contextlib.nullcontext):
        self.tf = tf
        self._internal = internal  # the hooks' "not a step" context for rtkit's own session runs
        self.settings = dict(settings)
        self.run_dir = run_dir
        self.stage = bool(settings.get("sched_stage"))
        self.depth = int(settings.get("sched_stage_depth") or 2)
        self.override = bool(settings.get("sched_override_user"))
        self.tune = bool(settings.get("sched_tune"))
        self.plan = _pools.make_plan(settings, self.tune)
        # with pipelining allowed, tuning also tries the job without it (a batch's feed costs a host copy)
        self.tuner = Tuner(self.plan.compute_sizes, self.plan.input_sizes,
                           int(settings.get("sched_tune_steps") or 0),
                           stage_options=(True, False) if self.stage else (False,),
                           drain_steps=self.depth) if self.tune else None
        self.active = {"compute": self.plan.compute_sizes[0], "input": self.plan.input_sizes[0],
                       "stage": self.stage}
        self.notes: List[str] = []
        self.trace = Trace()
        self.sessions_info: List[Dict] = []
        self._states: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
        self._pipelines: "weakref.WeakSet" = weakref.WeakSet()
        self._local = threading.local()
        self._lock = threading.Lock()
        self._sig_counts: Dict[tuple, int] = {}
        self.step_signature: Optional[tuple] = None
        self.step_runs = 0
        self.step_ms: List[float] = []
        self._traced_steps = 0
        self._input_trace_left = 0
        self._traced_inputs = 0
        self.stage_cost_ms = {s: 0.0 for s in STAGES}
        self.input_run_cost_ms = 0.0
        self.last_analysis: Optional[StageMap] = None
        self.keras: Dict[str, Any] = {}
        self.pin_result: Optional[Dict] = None
        self.profile_written: List[str] = []
        self.pipeline_stats = {"started": 0, "dropped_batches": 0, "errors_delivered": 0}
        self._occupancy: List[int] = []
        self._wait_ms: List[float] = []
        self._finished = False

    # ------------------------------------------------------------------ helpers
    def note(self, text: str) -> None:
        with self._lock:
            if text not in self.notes and len(self.notes) < MAX_NOTES:
                self.notes.append(text)

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
        self.note("tf.data thread options are per dataset (Dataset.with_options); rtkit does not reach "
                  "datasets built by tf.function/Keras code")

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

    # ------------------------------------------------------------------ run_wrappers
    def _state(self, session) -> _SessionState:
        st = self._states.get(session)
        if st is None:
            st = _SessionState(self._rtkit_routed(getattr(session, "_config", None)))
            self._states[session] = st
        return st

    def _analysis(self, session, st: _SessionState) -> StageMap:
        graph = session.graph
        if st.analysis is None or st.version != graph.version:
            st.analysis = analyze(graph)
            st.version = graph.version
            st.cache.clear()
            self.last_analysis = st.analysis
            for n in st.analysis.notes:
                self.note(n)
        return st.analysis

    def _classify(self, session, st, fetches, feed_dict):
        """-> (signature, mode) with mode in plain | pipelined | reset | uncovered."""
        graph = session.graph
        nest = self.tf.nest
        elems = []
        for leaf in nest.flatten(fetches):
            if hasattr(leaf, "indices") and hasattr(leaf, "dense_shape"):  # SparseTensor(Value)
                elems += [leaf.indices, leaf.values, leaf.dense_shape]
            else:
                elems.append(leaf)
        resolved = [graph.as_graph_element(e, allow_tensor=True, allow_operation=True) for e in elems]
        fed = set()
        for key in (feed_dict or {}):
            parts = [key.indices, key.values, key.dense_shape] if hasattr(key, "dense_shape") else [key]
            for p in parts:
                el = graph.as_graph_element(p, allow_tensor=True, allow_operation=False)
                fed.add(el.name)
        sig = tuple(sorted(e.name for e in resolved))
        key = (sig, tuple(sorted(fed)))
        sm = self._analysis(session, st)
        if st.pipeline is not None:
            key += (id(st.pipeline),)
        hit = st.cache.get(key)
        if hit is not None:
            return sig, hit
        fetch_ops = [getattr(e, "op", e) for e in resolved]
        reach = reachable(graph, fetch_ops, fed, stop=sm.pipelined | sm.resets)
        mode = "plain"
        if reach & sm.resets:
            mode = "reset"
        elif reach & sm.pipelined:
            # a running pipeline carries the boundary it was started with (the graph may have grown since)
            bset = {t.name for t in st.pipeline.boundary} if st.pipeline is not None else set(sm.boundary)
            covered = not any(fb in bset for fb in fed)
            for e in resolved:  # a fetched input-stage element must be a boundary tensor
                if getattr(e, "op", e).name in sm.pipelined and e.name not in bset:
                    covered = False
            for name in reach - sm.pipelined:
                op = graph.get_operation_by_name(name)
                for t in op.inputs:
                    if t.op.name in sm.pipelined and t.name not in fed and t.name not in bset:
                        covered = False
            mode = "pipelined" if covered and sm.cuttable else "uncovered"
        st.cache[key] = mode
        return sig, mode

    def wrap_run(self, session, run_next, fetches, feed_dict=None, options=None, run_metadata=None):
        if getattr(self._local, "bypass", False):
            return run_next(fetches, feed_dict, options, run_metadata)
        st = self._state(session)
        try:
            sig, mode = self._classify(session, st, fetches, feed_dict)
        except Exception as exc:  # never fail the job over analysis
            self.note(f"run not analysed ({type(exc).__name__}: {exc}); ran unchanged")
            return run_next(fetches, feed_dict, options, run_metadata)

        is_step = self._count_signature(sig)
        tracing = is_step and self._traced_steps < TRACE_STEPS and self.step_runs > WARM_RUNS
        if is_step and not tracing and self.tuner is not None and not self.tuner.done and self._traced_steps >= TRACE_STEPS:
            c, i, stg = self.tuner.current()
            self.active["compute"], self.active["input"], self.active["stage"] = c, i, stg

        # routing and tracing options
        opts = options
        md = run_metadata
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

        # pipelining
        feeds = feed_dict
        if mode == "reset" or mode == "uncovered":
            if mode == "uncovered" and self.stage and not st.stage_disabled and (st.analysis and st.analysis.cuttable):
                self.note("a run needed input-stage tensors the pipeline does not carry; pipelining stopped "
                          "for that session")
                st.stage_disabled = True
            self._stop_pipeline(st, "iterator reset/save run" if mode == "reset" else "uncovered run")
        elif mode == "pipelined" and self.stage and not st.stage_disabled and \
                (self.active["stage"] or self._draining(st)):
            pipe = self._pipeline(session, st)
            if tracing and self._traced_steps == 0:
                self._input_trace_left = TRACE_STEPS
            try:
                extra = pipe.next_feed()
            except BaseException:
                self.pipeline_stats["errors_delivered"] += 1
                self._occupancy += pipe.occupancy
                self._wait_ms += pipe.wait_ms
                st.pipeline = None
                raise
            feeds = dict(feed_dict or {})
            feeds.update(extra)
            st.pipelined_runs += 1

        t0 = time.time()
        result = run_next(fetches, feeds, opts, md)
        t1 = time.time()
        if is_step:
            ms = (t1 - t0) * 1000.0
            self.trace.add("steps", "step", t0 * 1e6, (t1 - t0) * 1e6, {"mode": mode})
            if tracing:
                self._traced_steps += 1
                self._take_stats(md, st, "step")
            else:
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
        return result

    def _count_signature(self, sig) -> bool:
        with self._lock:
            n = self._sig_counts.get(sig, 0) + 1
            self._sig_counts[sig] = n
            if self.step_signature is None and n >= WARM_RUNS:
                self.step_signature = sig
            if sig == self.step_signature:
                self.step_runs += 1
                return True
            return False

    def _take_stats(self, md, st: _SessionState, label: str, input_run: bool = False) -> None:
        if md is None or st.analysis is None:
            return
        cost = self.trace.add_step_stats(md.step_stats, st.analysis.stage, label)
        with self._lock:
            for k, v in cost.items():
                self.stage_cost_ms[k] += v
            if input_run:
                self._traced_inputs += 1
                self.input_run_cost_ms += sum(cost.values())

    # ------------------------------------------------------------------ pipeline
    def _pipeline(self, session, st: _SessionState) -> Pipeline:
        with st.lock:
            if st.pipeline is not None and not st.pipeline.finished:
                return st.pipeline
            if st.pipeline is not None:
                self._retire(st.pipeline)
            boundary = [session.graph.get_tensor_by_name(n) for n in st.analysis.boundary]
            ref = weakref.ref(session)
            pipe = Pipeline(boundary, self.depth, self._make_run_input(ref, st), self._pipe_event)
            st.pipeline = pipe
            self._pipelines.add(pipe)
            self.pipeline_stats["started"] += 1
            pipe.start()
            return pipe

    def _draining(self, st: _SessionState) -> bool:
        """Pipelining is off for now (a tuning trial or the choice): stop producing, serve what is queued."""
        pipe = st.pipeline
        if pipe is None:
            return False
        pipe.halt()
        if pipe.finished:
            self._retire(pipe)
            st.pipeline = None
            return False
        return True

    def _make_run_input(self, ref, st: _SessionState):
        RunOptions = self.tf.compat.v1.RunOptions
        RunMetadata = self.tf.compat.v1.RunMetadata

        def run_input(tensors):
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
            self._local.bypass = True
            try:
                with self._internal():  # rtkit's own run: not a step in the hooks' step timing
                    out = sess.run(tensors, options=opts, run_metadata=md)
            finally:
                self._local.bypass = False
            del sess
            if md is not None:
                self._take_stats(md, st, "input", input_run=True)
            return out
        return run_input

    def _pipe_event(self, kind: str, t0: float, t1: float, args: Dict) -> None:
        track = "pipeline-input-run" if kind == "input_run" else "pipeline-wait"
        self.trace.add(track, kind, t0 * 1e6, (t1 - t0) * 1e6, args)

    def _retire(self, pipe: Pipeline) -> int:
        dropped = pipe.stop()
        self._occupancy += pipe.occupancy
        self._wait_ms += pipe.wait_ms
        pipe.occupancy, pipe.wait_ms = [], []
        self.pipeline_stats["dropped_batches"] += dropped
        return dropped

    def _stop_pipeline(self, st: _SessionState, why: str) -> None:
        with st.lock:
            pipe, st.pipeline = st.pipeline, None
        if pipe is not None:
            dropped = self._retire(pipe)
            if dropped:
                self.note(f"pipeline stopped ({why}): {dropped} prefetched batch(es) dropped")

    # ------------------------------------------------------------------ close / exit
    def on_close(self, session) -> None:
        st = self._states.get(session)
        if st is not None:
            self._stop_pipeline(st, "session close")

    def stop_all(self) -> None:
        for pipe in list(self._pipelines):
            self._retire(pipe)

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
        occ = self._occupancy + [o for p in list(self._pipelines) for o in p.occupancy]
        waits = self._wait_ms + [w for p in list(self._pipelines) for w in p.wait_ms]
        tuning = self.tuner.report() if self.tuner else None
        med = statistics.median(self.step_ms) if self.step_ms else None
        return {
            "schema_version": 1,
            "pid": os.getpid(),
            "settings": {k: v for k, v in self.settings.items() if k.startswith("sched")},
            "sessions": self.sessions_info,
            "keras": self.keras,
            "stages": stages,
            "stage_cost_source": f"RunMetadata step_stats of {self._traced_steps} traced step(s) and "
                                 f"{self._traced_inputs} traced input run(s); op time summed per stage",
            "step_signature": list(self.step_signature) if self.step_signature else None,
            "steps_seen": self.step_runs,
            "step_ms_median": med,
            "chosen": {"compute_threads": self.active["compute"], "input_threads": self.active["input"],
                       "intra_op_threads": self.plan.intra_op, "stage_pipelined": self.active["stage"],
                       "stage_depth_steps": self.depth if self.active["stage"] else 0},
            "tuning": tuning,
            "speedup_over_first_x": tuning["speedup_over_first_x"] if tuning else None,
            "pipeline": {
                "enabled": self.stage,
                "cuttable": bool(sm and sm.cuttable),
                "depth_steps": self.depth,
                "boundary_tensors": list(sm.boundary) if sm else [],
                "pipelined_ops": len(sm.pipelined) if sm else 0,
                "pipelines_started": self.pipeline_stats["started"],
                "dropped_batches": self.pipeline_stats["dropped_batches"],
                "errors_delivered": self.pipeline_stats["errors_delivered"],
                "occupancy_samples_batches": occ[:2000],
                "occupancy_mean_batches": (sum(occ) / len(occ)) if occ else None,
                "wait_ms_median": statistics.median(waits) if waits else None,
                "steps_waited_pct": (100.0 * sum(1 for o in occ if o == 0) / len(occ)) if occ else None,
            },
            "pinning": self.pin_result,
            "profiles_written": self.profile_written,
            "notes": self.notes,
        }

    def at_exit(self) -> None:
        if self._finished:
            return
        self._finished = True
        self.stop_all()
        if self.run_dir:
            try:
                write_report(self.run_dir, self.report(), self.trace.chrome())
            except OSError as exc:
                self.note(f"cannot write the scheduler report: {exc}")
