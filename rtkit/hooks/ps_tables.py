# ps_tables.py -- what each parameter server holds, table by table, recorded by the chief (the task that knows the graph).
"""A PS process sees only tensors arriving over gRPC; the chief's graph says what lives where. When a
session of the chief closes (MonitoredTrainingSession's included, at the end of training), every
stateful object placed on ``/job:ps/task:N`` is listed with its bytes and written to
``RUN_DIR/ps-tables.json`` (rewritten at each close: the last one wins):

- variables (resource or ref) and optimizer slots (a variable named ``<variable>/<slot>``): the static
  shape x dtype size, the tensor's own bytes (exact; the allocator's rounding excluded);
- hash tables (MutableHashTable, dense and immutable ones): entries, read with one LookupTableSizeV2
  run per table at that close, x (key + value) bytes. An **estimate**: a lower bound, the hash map's
  own nodes and buckets excluded.

The cluster merge (rtkit/cluster/merge.py) attributes them to the PS rows.
"""
from __future__ import annotations

import os
import re
import time
from typing import Any, Dict, List, Optional

from rtkit.cluster.taskdir import TABLES_FILE

_VARIABLE_OPS = ("VarHandleOp", "VariableV2", "Variable")
_HASH_OPS = ("MutableHashTableV2", "MutableHashTableOfTensorsV2", "MutableDenseHashTableV2", "HashTableV2",
             "MutableHashTable", "MutableHashTableOfTensors", "MutableDenseHashTable", "HashTable")
_PS_RE = re.compile(r"/job:ps(?:/replica:\d+)?(?:/task:(\d+))?")
SIZE_TIMEOUT_MS = 10_000
_installed = False


def ps_task_of(device: str) -> Optional[int]:
    """The PS task index of a device string, None when it is not on a PS (a bare /job:ps is task 0)."""
    m = _PS_RE.search(device or "")
    if not m:
        return None
    return int(m.group(1) or 0)


def _dtype_size(tf, dtype) -> Optional[int]:
    d = tf.as_dtype(dtype)
    return None if d == tf.string or d.size == 0 else d.size


def _elements(shape) -> Optional[int]:
    if shape.rank is None or any(d is None for d in shape.as_list()):
        return None
    n = 1
    for d in shape.as_list():
        n *= d
    return n


def describe(tf, graph) -> List[Dict[str, Any]]:
    """The PS-placed objects of `graph` (hash tables without their entries yet: see measure())."""
    objs = []
    for op in graph.get_operations():
        task = ps_task_of(op.device)
        if task is None:
            continue
        if op.type in _VARIABLE_OPS:
            shape = tf.TensorShape(op.get_attr("shape"))
            size, n = _dtype_size(tf, op.get_attr("dtype")), _elements(shape)
            objs.append({"ps": task, "name": op.name, "kind": "variable", "dtype": tf.as_dtype(op.get_attr("dtype")).name,
                         "shape": shape.as_list() if shape.rank is not None else None,
                         "bytes": size * n if size is not None and n is not None else None, "estimate": False})
        elif op.type in _HASH_OPS:
            key, value = op.get_attr("key_dtype"), op.get_attr("value_dtype")
            vshape = tf.TensorShape(op.get_attr("value_shape")) if "value_shape" in op.node_def.attr else tf.TensorShape([])
            ks, vs, vn = _dtype_size(tf, key), _dtype_size(tf, value), _elements(vshape)
            objs.append({"ps": task, "name": op.name, "kind": "hash table", "dtype":
                         f"{tf.as_dtype(key).name}->{tf.as_dtype(value).name}", "shape": vshape.as_list() if vshape.rank else [],
                         "entries": None, "entry_bytes": ks + vs * vn if None not in (ks, vs, vn) else None,
                         "bytes": None, "estimate": True, "_op": op})
    names = {o["name"] for o in objs if o["kind"] == "variable"}
    for o in objs:   # an optimizer slot is a variable named after another one: <variable>/<slot name>
        head, _, tail = o["name"].rpartition("/")
        if o["kind"] == "variable" and head in names and tail:
            o["kind"], o["of"] = "slot", head
    return objs


def measure(tf, session, objs: List[Dict[str, Any]]) -> None:
    """Fill in the hash tables' entries and bytes with one run of their size ops (added to the graph, which
    a MonitoredTrainingSession has finalized: unfinalized for that and finalized again)."""
    tables = [o for o in objs if o["kind"] == "hash table"]
    if not tables:
        return
    graph = session.graph
    was_final = graph.finalized
    if was_final:
        graph._unsafe_unfinalize()
    try:
        with graph.as_default():
            sizes = []
            for o in tables:
                with tf.compat.v1.device(o["_op"].device):
                    sizes.append(tf.raw_ops.LookupTableSizeV2(table_handle=o["_op"].outputs[0]))
    finally:
        if was_final:
            graph.finalize()
    from rtkit.hooks import session as session_timing

    with session_timing.internal():   # bounded: a PS that is gone must not hold the user's close up
        values = session.run(sizes, options=tf.compat.v1.RunOptions(timeout_in_ms=SIZE_TIMEOUT_MS))
    for o, n in zip(tables, values):
        o["entries"] = int(n)
        o["bytes"] = int(n) * o["entry_bytes"] if o["entry_bytes"] is not None else None


def snapshot(tf, session) -> Optional[Dict[str, Any]]:
    objs = describe(tf, session.graph)
    if not objs:
        return None
    note = None
    try:
        measure(tf, session, objs)
    except Exception as exc:   # a table on a PS already gone: its entries stay unknown
        note = f"hash table sizes not read: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    by_ps: Dict[str, List[Dict[str, Any]]] = {}
    for o in sorted(objs, key=lambda o: (o["ps"], -(o["bytes"] or 0), o["name"])):
        o.pop("_op", None)
        by_ps.setdefault(str(o.pop("ps")), []).append(o)
    return {"ps_tables_schema": 1, "written_unix": round(time.time(), 3),
            "source": "the chief's graph, at its session's close",
            "method": {"variable": "static shape x dtype size (exact tensor bytes)",
                       "slot": "static shape x dtype size (exact tensor bytes)",
                       "hash table": "entries x (key + value) bytes (estimate: a lower bound, the map's own "
                                     "overhead excluded)"},
            "note": note, "ps": by_ps}


def install(tf) -> None:
    """In the chief task of a cluster under rtkit, record the PS tables at every session close."""
    global _installed
    import sys

    from rtkit.cluster import spec
    from rtkit.hooks import registry
    from rtkit.hooks.steps import recorder

    try:
        task = spec.detect(os.environ, sys.argv)
    except spec.ClusterError:
        return
    run_dir = os.environ.get("RTKIT_RUN_DIR")
    if _installed or task is None or not task.is_chief or not run_dir:
        return
    _installed = True
    rec = recorder()

    def record_ps_tables(session) -> None:
        if getattr(session, "_closed", False):   # closed before (MonitoredSession closes its session twice)
            return
        try:
            doc = snapshot(tf, session)
        except Exception as exc:   # the user's session closes all the same
            rec.notes.append(f"PS tables not recorded: {exc!r}")
            return
        if doc is None:
            return
        from rtkit import atomic

        try:
            atomic.write_json(os.path.join(run_dir, TABLES_FILE), doc)
        except OSError:
            pass

    registry.close_callbacks.append(record_ps_tables)
