# tf_function.py -- hands eager tf.function calls to the step owner, and tf.data input of eager loops to the filters.
"""A TF2 custom loop calls one ``@tf.function`` step per batch from Python. The calls are seen from outside the
user's code, at ``Function.__call__`` (every polymorphic function) and ``ConcreteFunction.__call__`` (a concrete
function called directly). Only the outermost eager call counts: a tf.function called while another one runs (or
traces), a call in graph mode, and the functions Keras fit runs for its batches (it has its own hook) are left
alone. Each counted call is timed with its page faults and handed to rtkit.hooks.steps under the function's name,
with whether it traced a new concrete function, so the step owner can tell a stable step from a retracing storm.

A tf.data dataset iterated in eager mode (``for batch in dataset``) goes through the components' dataset filters
first, as Keras fit's input does (the scheduler's input pool and prefetch), once per dataset object."""
from __future__ import annotations

import contextlib
import threading
import time
import weakref

from rtkit.hooks import gradient_ops, registry
from rtkit.hooks.steps import minor_faults, recorder

_PATCHED_FLAG = "_rtkit_patched"
_NAME_ATTR = "_rtkit_step_name"
API = "tf.function calls"
API_CONCRETE = "concrete function calls"
_local = threading.local()


@contextlib.contextmanager
def not_steps():
    """tf.function calls on this thread inside the block are not candidate steps (Keras fit counts its batches)."""
    _local.depth = getattr(_local, "depth", 0) + 1
    try:
        yield
    finally:
        _local.depth -= 1


def _function_name(fn) -> str:
    name = fn.__dict__.get(_NAME_ATTR)
    if name is None:
        py = getattr(fn, "_python_function", None)
        qual = getattr(py, "__qualname__", None) or getattr(fn, "__name__", None) or "?"
        module = getattr(py, "__module__", None)
        name = f"tf.function {module}.{qual}" if module else f"tf.function {qual}"
        fn.__dict__[_NAME_ATTR] = name
    return name


def _concrete_name(fn) -> str:
    name = fn.__dict__.get(_NAME_ATTR)
    if name is None:
        raw = getattr(fn, "name", b"?")
        name = "concrete function " + (raw.decode() if isinstance(raw, bytes) else str(raw))
        fn.__dict__[_NAME_ATTR] = name
    return name


_CHECKED_ATTR = "_rtkit_graphs_checked"
MAX_GRAPHS_CHECKED = 4   # traces of one function looked at: a retracing storm is never the step anyway


def _computes_gradients(fn, concrete_graphs, traced: bool) -> bool:
    """Whether fn's traced graphs compute gradients (a training step, not an evaluation): looked at on its first
    call and on calls that traced, for its first few traces, and no more once they do (the step owner keeps a
    signature's True); False otherwise."""
    checked = fn.__dict__.get(_CHECKED_ATTR, 0)
    if (checked and not traced) or checked >= MAX_GRAPHS_CHECKED:
        return False
    try:
        trains = any(gradient_ops.graph_computes_gradients(g) for g in concrete_graphs(fn))
    except Exception:   # a TensorFlow without these internals: the step is then told by recurrence alone
        trains = False
    fn.__dict__[_CHECKED_ATTR] = MAX_GRAPHS_CHECKED if trains else checked + 1
    return trains


def _function_graphs(fn):
    return [cf.graph for cf in fn._list_all_concrete_functions()]


def _wrap_call(orig, name_of, api: str, tracing_count, executing_eagerly, graphs_of):
    rec = recorder()

    def __call__(self, *args, **kwds):
        if getattr(_local, "depth", 0) or not executing_eagerly():
            return orig(self, *args, **kwds)
        traces = tracing_count(self)
        _local.depth = 1
        start_unix, t0, f0 = time.time(), time.perf_counter(), minor_faults()
        try:
            result = orig(self, *args, **kwds)
        finally:
            _local.depth = 0
        ms = (time.perf_counter() - t0) * 1000.0
        try:
            traced = tracing_count(self) != traces
            rec.record("function", name_of(self), start_unix, ms, minor_faults() - f0, api, traced=traced,
                       trains=_computes_gradients(self, graphs_of, traced))
        except Exception as exc:
            rec.notes.append(f"tf.function step recording failed: {exc!r}")
        return result

    __call__.__wrapped__ = orig
    __call__.__doc__ = orig.__doc__
    return __call__


def _hook_datasets(dataset_ops, executing_eagerly) -> None:
    base = dataset_ops.DatasetV2
    orig_iter = base.__iter__
    filtered: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
    rec = recorder()

    def __iter__(self):
        filters = registry.dataset_filters
        if not filters or getattr(_local, "depth", 0) or not executing_eagerly():
            return orig_iter(self)
        try:
            ds = filtered.get(self)
            if ds is None:
                ds = self
                for fn in list(filters):
                    ds = fn(ds)
                filtered[self] = ds
        except Exception as exc:   # the script's own dataset, unchanged
            rec.notes.append(f"dataset filter failed on an eager tf.data input: {exc!r}")
            return orig_iter(self)
        return orig_iter(ds)

    __iter__.__wrapped__ = orig_iter
    __iter__.__doc__ = orig_iter.__doc__
    base.__iter__ = __iter__


def install() -> None:
    """Raises when this TensorFlow lacks what the hook needs (the caller reports why; nothing is patched then)."""
    from tensorflow.python.data.ops import dataset_ops
    from tensorflow.python.eager import context
    from tensorflow.python.eager.polymorphic_function import concrete_function, polymorphic_function

    function_cls = polymorphic_function.Function
    concrete_cls = concrete_function.ConcreteFunction
    if getattr(function_cls, _PATCHED_FLAG, False):
        return
    for cls, attr in ((function_cls, "__call__"), (function_cls, "experimental_get_tracing_count"),
                      (concrete_cls, "__call__"), (dataset_ops.DatasetV2, "__iter__")):
        if not callable(getattr(cls, attr, None)):
            raise AttributeError(f"{cls.__module__}.{cls.__name__}.{attr} not found")
    eager = context.executing_eagerly
    function_cls.__call__ = _wrap_call(function_cls.__call__, _function_name, API,
                                       function_cls.experimental_get_tracing_count, eager, _function_graphs)
    concrete_cls.__call__ = _wrap_call(concrete_cls.__call__, _concrete_name, API_CONCRETE, lambda fn: 0, eager,
                                       lambda fn: [fn.graph])
    _hook_datasets(dataset_ops, eager)
    setattr(function_cls, _PATCHED_FLAG, True)
