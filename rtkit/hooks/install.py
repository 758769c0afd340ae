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


def on_tensorflow(tf) -> None:
    rec = recorder()
    _ensure_exit_hook()
    version = getattr(tf, "__version__", None)
    try:
        from tensorflow.python.client import pywrap_tf_session, session as session_module

        from rtkit.hooks import session

        session.install(session_module, pywrap_tf_session)
        rec.hook = {"status": "ok", "detail": "hooks on tf.compat.v1 sessions and Keras fit", "tensorflow_version": version}
    except Exception as exc:
        rec.hook = {"status": "failed", "detail": f"session hooks not installed: {exc!r}",
                    "tensorflow_version": version}
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

            sched = scheduler.activate(tf, values, os.environ.get("RTKIT_RUN_DIR") or None, internal=registry.internal,
                                        before_run=registry.before_run, timed_run=registry.timed_run)
            if sched.on_close not in registry.close_callbacks:  # once per process, however often TF is hooked
                registry.register(sched)
        except Exception as exc:  # the job runs on TF's defaults
            rec.notes.append(f"scheduler not activated: {exc!r}; TensorFlow's defaults apply")
    rec.flush()


def on_keras(keras) -> None:
    rec = recorder()
    _ensure_exit_hook()
    try:
        from rtkit.hooks import keras_fit

        keras_fit.install(keras)
    except Exception as exc:
        rec.notes.append(f"Keras fit hook not installed: {exc!r}")
