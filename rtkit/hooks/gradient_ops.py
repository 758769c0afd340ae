# gradient_ops.py -- tells a training run from an evaluation: whether a graph, or a session run's ops, compute gradients
"""The step owner (steps.py) prefers a call that trains over one that only evaluates, however often that recurs:
a script that predicts over its training and validation sets after every epoch (and over a test set at the end)
makes more forward-only runs than train runs. What trains is told by the ops only gradient computation makes:
a GradientTape's (under ``gradient_tape/``) and tf.gradients' (under ``gradients/``, ``gradients_1/`` for a second
call in the same graph; an optimizer's minimize() makes them). A tf.function's traced graph holds them itself
or in the functions it calls; a tf.compat.v1 session run trains when its targets or fetches depend on one (an
optimizer's train op reads the gradients it applies)."""
from __future__ import annotations

import re
import threading
import weakref
from typing import Iterable

GRADIENT_SCOPE = re.compile(r"(?:^|/)(?:gradient_tape|gradients(?:_\d+)?)/")
# a run's dependencies walked at most this far: a forward graph of this size is walked once per signature, and a
# train op reaches its gradients within a few ops of its update ops, long before
MAX_OPS_WALKED = 100_000
# per tf.Graph (whose C++-backed objects take no attributes): {run signature: bool}; a graph that goes drops its entry
_known: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_known_lock = threading.Lock()


def computing_gradients(name: str) -> bool:
    """Whether an op of this name is one that only gradient computation makes."""
    return GRADIENT_SCOPE.search(name) is not None


def graph_computes_gradients(graph) -> bool:
    """A traced graph's own ops, and those of the functions it calls (a nested tf.function, a distribution
    strategy's replica function: a call op there, their ops in the graph's function library)."""
    if any(computing_gradients(op.name) for op in graph.get_operations()):
        return True
    library = graph.as_graph_def().library.function
    return any(computing_gradients(node.name) for f in library for node in f.node_def)


def ops_reach_gradients(graph, op_names: Iterable[str], limit: int = MAX_OPS_WALKED) -> bool:
    """Whether the named ops of `graph`, or any op they depend on (data or control inputs), compute gradients."""
    stack = []
    for name in op_names:
        try:
            stack.append(graph.get_operation_by_name(name))
        except (KeyError, ValueError, TypeError):
            continue   # a name this graph does not hold (a component's run): nothing to follow
    seen = set()
    while stack and len(seen) < limit:
        op = stack.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        if computing_gradients(op.name):
            return True
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
    return False


def run_computes_gradients(graph, signature: str, op_names: Iterable[str]) -> bool:
    """ops_reach_gradients, decided once per graph and run signature (a run's signature names the same ops each
    time it recurs): later runs cost one dictionary look-up. False where the graph cannot be read."""
    try:
        with _known_lock:
            cache = _known.setdefault(graph, {})
    except TypeError:   # a graph that cannot be weakly referenced: the step is told by recurrence alone
        return False
    known = cache.get(signature)
    if known is None:
        try:
            known = ops_reach_gradients(graph, op_names)
        except Exception:   # a TensorFlow without these graph internals: the step is told by recurrence alone
            known = False
        cache[signature] = known
    return known
