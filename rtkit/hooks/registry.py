# registry.py -- the hooks' extension points, at which rtkit.hooks.install registers components (the scheduler).
"""The hooks own these lists; a component never imports this module, it only offers the callables:
config_filters (each session's ConfigProto), run_wrappers (around each Session.run), close_callbacks
(before a session closes) and exit_callbacks (at interpreter exit, before the step file's last flush). What a
component needs from the session step timing (`internal`, `before_run`, `timed_run`) is in rtkit.hooks.session,
the one file that times a session run."""
from typing import Callable, List

config_filters: List[Callable] = []     # fn(config) -> config, at BaseSession.__init__
run_wrappers: List[Callable] = []       # fn(session, run_next, fetches, feed_dict, options, run_metadata)
callable_wrappers: List[Callable] = []  # fn(session, make_next, fetches, feed_list, accept_options) -> callable
dataset_filters: List[Callable] = []    # fn(dataset, origin=...) -> dataset: Keras fit's x (origin "fit"), eager iterators
close_callbacks: List[Callable] = []    # fn(session), before BaseSession.close
exit_callbacks: List[Callable] = []     # fn(), at interpreter exit


def register(component) -> None:
    """Join a component that offers wrap_run, on_close and at_exit, and optionally filter_config (the Scheduler
    does; the lookahead alone, scheduler/feeds_only.py, leaves the sessions' ConfigProtos alone), wrap_callable
    (Session.make_callable), filter_dataset (tf.data input of Keras fit and of eager loops) and on_step (a
    subscriber of the step owner, rtkit.hooks.steps)."""
    from rtkit.hooks import steps

    if hasattr(component, "on_step"):
        steps.subscribe(component.on_step)
    if hasattr(component, "filter_config"):
        config_filters.append(component.filter_config)
    run_wrappers.append(component.wrap_run)
    if hasattr(component, "wrap_callable"):
        callable_wrappers.append(component.wrap_callable)
    if hasattr(component, "filter_dataset"):
        dataset_filters.append(component.filter_dataset)
    close_callbacks.append(component.on_close)
    exit_callbacks.append(component.at_exit)

