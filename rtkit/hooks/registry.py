# registry.py -- the hooks' extension points, at which rtkit.hooks.install registers components (the scheduler).
"""The hooks own these lists; a component never imports this module, it only offers the callables:
config_filters (each session's ConfigProto), run_wrappers (around each Session.run), close_callbacks
(before a session closes) and exit_callbacks (at interpreter exit, before the step file's last flush).
`internal()` marks rtkit's own session runs, which are not training steps; `before_run(ms)` adds time a
component spent on a run's behalf before it reached TensorFlow (waiting for a staged batch) to the step that follows
on the same thread, so a step's time is what the script waited for, not TF's part alone. `timed_run` times a run a
component makes through a path the session hooks do not see (a callable made from CallableOptions) and records it
as the run it stands for."""
import contextlib
import threading
from typing import Callable, List

config_filters: List[Callable] = []     # fn(config) -> config, at BaseSession.__init__
run_wrappers: List[Callable] = []       # fn(session, run_next, fetches, feed_dict, options, run_metadata)
callable_wrappers: List[Callable] = []  # fn(session, make_next, fetches, feed_list, accept_options) -> callable
dataset_filters: List[Callable] = []    # fn(dataset) -> dataset: Keras fit's tf.data input, eager iterators
close_callbacks: List[Callable] = []    # fn(session), before BaseSession.close
exit_callbacks: List[Callable] = []     # fn(), at interpreter exit

_local = threading.local()
# set by rtkit.hooks.session: fn(session, fetch names, target names, call) -> call()'s result, timed and recorded
_timer = None


@contextlib.contextmanager
def internal():
    """Session runs made by rtkit itself (e.g. a pipelined input stage) inside this block are not steps."""
    previous = getattr(_local, "internal", False)
    _local.internal = True
    try:
        yield
    finally:
        _local.internal = previous


def before_run(ms: float) -> None:
    """A component spent `ms` before this thread's next session run, on that run's behalf."""
    _local.pre_ms = getattr(_local, "pre_ms", 0.0) + float(ms)


def take_before_run_ms() -> float:
    """The time components spent before this run (consumed: the next run starts from zero)."""
    ms = getattr(_local, "pre_ms", 0.0)
    _local.pre_ms = 0.0
    return ms


def timed_run(session, fetch_names, target_names, call):
    """Run `call()` (one TF call for `session`) timed and recorded as the session hooks record a Session.run with
    these fetches and targets; just call() when the session hooks are not installed."""
    timer = _timer
    return call() if timer is None else timer(session, fetch_names, target_names, call)


def register(component) -> None:
    """Join a component that offers filter_config, wrap_run, on_close and at_exit (the Scheduler does), and
    optionally wrap_callable (Session.make_callable), filter_dataset (tf.data input of Keras fit and of eager
    loops) and on_step (a subscriber of the step owner, rtkit.hooks.steps)."""
    from rtkit.hooks import steps

    if hasattr(component, "on_step"):
        steps.subscribe(component.on_step)
    config_filters.append(component.filter_config)
    run_wrappers.append(component.wrap_run)
    if hasattr(component, "wrap_callable"):
        callable_wrappers.append(component.wrap_callable)
    if hasattr(component, "filter_dataset"):
        dataset_filters.append(component.filter_dataset)
    close_callbacks.append(component.on_close)
    exit_callbacks.append(component.at_exit)


def is_internal() -> bool:
    return getattr(_local, "internal", False)
