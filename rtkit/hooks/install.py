# install.py -- what the bootstrap runs when TensorFlow or Keras finishes importing in the child.
from __future__ import annotations

import atexit
import os

from rtkit.hooks import registry
from rtkit.hooks.steps import recorder

_exit_registered = False


def _run_exit_callbacks() -> None:
    rec = recorder()
    for fn in list(registry.exit_callbacks):
        try:
            fn()
        except Exception as exc:
            rec.notes.append(f"exit callback {getattr(fn, '__name__', fn)} failed: {exc!r}")
    rec.flush()


def _ensure_exit_hook() -> None:
    global _exit_registered
    if not _exit_registered:
        atexit.register(_run_exit_callbacks)
        _exit_registered = True


def settings() -> dict:
    from rtkit import config as cfg

    return {s.key: cfg.from_child_env(s.key) for s in cfg.SETTINGS}


_hooked: list = []    # the APIs hooked in this process, in the words of the report's hook status
_missing: list = []   # what could not be hooked, with its reason


def _add(items: list, text: str) -> None:
    if text not in items:   # TensorFlow may be hooked more than once
        items.append(text)


def _set_hook_status(rec, version=None) -> None:
    version = version or rec.hook.get("tensorflow_version")
    text = ("hooks on " + ", ".join(_hooked)) if _hooked else "no hooks"
    rec.hook = {"status": "ok" if _hooked else "failed", "detail": "; ".join([text] + _missing),
                "tensorflow_version": version}


def on_tensorflow(tf) -> None:
    rec = recorder()
    _ensure_exit_hook()
    version = getattr(tf, "__version__", None)
    hooked, missing = _hooked, _missing
    try:
        from tensorflow.python.client import pywrap_tf_session, session as session_module

        from rtkit.hooks import session

        session.install(session_module, pywrap_tf_session)
        _add(hooked, "tf.compat.v1 sessions")
    except Exception as exc:
        _add(missing, f"session hooks not installed: {exc!r}")
    try:
        from rtkit.hooks import tf_function

        tf_function.install()
        _add(hooked, "tf.function calls")
    except Exception as exc:   # an unknown TensorFlow: its tf.function steps go uncounted, the script runs as it is
        _add(missing, f"tf.function hook not installed on TensorFlow {version}: {exc!r}")
    _set_hook_status(rec, version)
    try:   # a parameter server has no Session.run of its own: give it the cluster's global step
        from rtkit.hooks import ps_steps

        ps_steps.install(tf)
    except Exception as exc:
        rec.notes.append(f"parameter-server step signal not installed: {exc!r}")
    try:   # the chief knows the graph: what each parameter server holds, table by table
        from rtkit.hooks import ps_tables

        ps_tables.install(tf)
    except Exception as exc:
        rec.notes.append(f"parameter-server tables not recorded: {exc!r}")
    from rtkit.hooks import tf2_cluster

    tf2_cluster.install(tf, rec)
    values = settings()
    if values["sched"]:
        try:
            from rtkit import scheduler
            from rtkit.hooks import session as session_timing

            sched = scheduler.activate(tf, values, os.environ.get("RTKIT_RUN_DIR") or None, internal=session_timing.internal,
                                        before_run=session_timing.before_run,
                                        timed_run=session_timing.timed_run)
            if sched.on_close not in registry.close_callbacks:  # once per process, however often TF is hooked
                registry.register(sched)
        except Exception as exc:  # the job runs on TF's defaults
            rec.notes.append(f"scheduler not activated: {exc!r}; TensorFlow's defaults apply")
    else:
        _lookahead_alone(tf, values, rec)
    rec.flush()


def _lookahead_alone(tf, values: dict, rec) -> None:
    """Tier mode with the scheduler off (the capacity profile): its lookahead of fed ids alone, when wanted."""
    if not values.get("tier_pool_path"):   # not tier mode: the scheduler is not even imported
        return
    try:
        from rtkit import scheduler
        from rtkit.hooks import session as session_timing
        from rtkit.scheduler import feeds_only

        if not feeds_only.wanted(values):
            return
        sched = scheduler.activate(tf, values, os.environ.get("RTKIT_RUN_DIR") or None,
                                   internal=session_timing.internal, before_run=session_timing.before_run,
                                   timed_run=session_timing.timed_run, lookahead_only=True)
        if getattr(sched, "feeds_only", None) is None:   # once per process, however often TF is hooked
            sched.feeds_only = feeds_only.FedLookaheadOnly(sched)
            registry.register(sched.feeds_only)
    except Exception as exc:  # the job runs without it
        rec.notes.append(f"the tier lookahead of fed ids not activated: {exc!r}")


def on_keras(keras) -> None:
    """Keras 3 (`keras`) or Keras 2 (`tf_keras`, what tf.keras is under TF_USE_LEGACY_KERAS=1)."""
    rec = recorder()
    _ensure_exit_hook()
    name = f"{getattr(keras, '__name__', 'keras')} {getattr(keras, '__version__', '?')}"
    try:
        from rtkit.hooks import keras_fit

        keras_fit.install(keras)
        _add(_hooked, f"Keras fit ({name})")
    except Exception as exc:   # its batches then count as the tf.function calls they are, if they recur
        _add(_missing, f"Keras fit of {name} not hooked: {exc!r}")
    _set_hook_status(rec)
