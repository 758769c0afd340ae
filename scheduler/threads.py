# threads.py -- the thread side of the Scheduler: session ConfigProtos, per-stage pools, eager and tf.data options.
"""The thread sizes applied are `self.active` (the tuner's current candidate, or the plan's first); a session whose
ConfigProto names rtkit's pools is routed: each run is sent to the pool of its stage."""
from __future__ import annotations

from typing import Any, Dict, List

from . import pools as _pools


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


class ThreadConfig:
    """Mixed into Scheduler: the plan of pools (`self.plan`) and what each session and dataset was given. `st`
    is a session's staging state (pipeline.py), of which the thread side reads `routed`."""

    def _init_threads(self, settings: Dict[str, Any]) -> None:
        self.override = bool(settings.get("sched_override_user"))
        self.plan = _pools.make_plan(settings, self.tune)
        self.sessions_info: List[Dict] = []
        self.keras: Dict[str, Any] = {}

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

    def filter_dataset(self, dataset, origin: str = "outside fit"):
        """A tf.data input of Keras fit or of an eager loop: the input pool's size as the dataset's private thread
        pool and, with staging on, a final prefetch of sched_stage_depth batches; an option the dataset has already
        wins. origin: "fit" for fit's x (Keras's own input made from arrays inside fit is never seen here), "outside
        fit" for a dataset iterated eagerly (an eager loop, or Keras predict and evaluate); recorded as "input"."""
        try:
            if not isinstance(dataset, self.tf.data.Dataset):
                if origin == "fit":   # arrays, a generator...: Keras makes its own input inside fit, left alone
                    with self._lock:
                        self.keras["fit_inputs_not_datasets"] = self.keras.get("fit_inputs_not_datasets", 0) + 1
                return dataset
            applied: Dict[str, Any] = {"input": origin}
            out = dataset
            if not dataset.options().threading.private_threadpool_size:
                opts = self.tf.data.Options()
                opts.threading.private_threadpool_size = self.active["input"]
                out = out.with_options(opts)
                applied["private_threadpool_size"] = self.active["input"]
            else:
                applied["private_threadpool_size"] = "the script's own"
            if self.stage:
                if _ends_with_prefetch(dataset):   # the script's, or Keras's own (its inputs made from arrays)
                    applied["prefetch"] = "the dataset's own"
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

    def _options(self, st, options, run_metadata, tracing):
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

