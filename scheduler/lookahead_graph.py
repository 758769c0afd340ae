# lookahead_graph.py -- which table rows the next staged batch gathers: a read-only copy of its index computation.
"""plan(graph, staged) finds the gathers of table variables (ResourceGather on a variable's handle, GatherV2 on a
ReadVariableOp or on a TF1 reference variable's snapshot) whose indices are computed from the staged boundary tensors, and copies that index computation
into the graph (import_graph_def under rtkit_lookahead/), reading the staged boundary tensors as the put computes
them. The copy only reads state: a hash-table lookup and a variable read are copied, any other stateful op
refuses the gather, control dependencies (the writes a step orders before its gather: an insert, a row
initialisation) are dropped, and a variable read ordered after an AssignAddVariableOp (the EmbeddingVariable
analogue's row counter, `counter.assign_add(n) - n`) is copied as the read plus the amount, so the copy gives the
rows the step would give and writes nothing. Also built: a touch op per table and its optimizer slots (a
ResourceGather on fed rows), which reads the rows' pages and writes no table memory."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

SCOPE = "rtkit_lookahead"
# stateful ops that only read: copied into the index computation
READ_ONLY = {"ReadVariableOp", "LookupTableFindV2", "LookupTableFind", "LookupTableSizeV2", "ResourceGather"}
GATHERS = {"ResourceGather", "GatherV2", "Gather"}
# a TF1 reference variable (tf.compat.v1.disable_v2_behavior(), or disable_resource_variables): no handle, its
# ref tensor is gathered through its snapshot (an Identity, `<var>/read`), and its optimizers are SparseApply*
REF_VARIABLES = {"VariableV2", "Variable"}


@dataclass
class Table:
    """A gathered table: its variable's handle, the optimizer slots updated at the same rows, and its row bytes."""
    name: str
    handle: object
    dtype: object
    row_bytes: int
    rows: int
    slots: List[object] = field(default_factory=list)


@dataclass
class Plan:
    """The copied index tensors (one per gather, fetched with the put), the table each one indexes, and per table
    the touch op's feed (rows) and target."""
    index_tensors: List[object]
    table_of_index: List[str]
    tables: Dict[str, Table]
    touch_feeds: Dict[str, object] = field(default_factory=dict)
    touch_ops: Dict[str, List[object]] = field(default_factory=dict)
    skipped: List[str] = field(default_factory=list)
    fed_inputs: List[Tuple[str, ...]] = field(default_factory=list)   # plan_feeds: each index tensor's placeholders
    gather_ops: List[str] = field(default_factory=list)               # the gather each index tensor feeds


def _is_variable(t) -> bool:
    """A resource variable's handle or a reference variable's ref tensor."""
    return t.op.type == "VarHandleOp" or (t.op.type in REF_VARIABLES and t.dtype._is_ref_dtype)


def _handle_of(op):
    """The variable tensor a gather reads its rows from (a resource variable's handle, a reference variable's ref
    tensor), or None when it does not gather a variable."""
    if op.type == "ResourceGather":
        h = op.inputs[0]
    elif op.type in ("GatherV2", "Gather"):
        p = op.inputs[0].op
        if p.type == "ReadVariableOp" or (p.type == "Identity" and p.inputs[0].op.type in REF_VARIABLES):
            h = p.inputs[0]
        elif p.type in REF_VARIABLES:
            h = op.inputs[0]
        else:
            return None
        if op.type == "GatherV2" and (op.inputs[2].op.type != "Const" or _const(op.inputs[2].op) != 0):
            return None   # rows only: axis 0
    else:
        return None
    return h if _is_variable(h) else None


def _const(op):
    from tensorflow.python.framework import tensor_util

    return int(tensor_util.MakeNdarray(op.get_attr("value")))


def _table(graph, handle) -> Optional[Table]:
    op = handle.op
    dtype = op.get_attr("dtype")
    shape = op.get_attr("shape")
    dims = [d.size for d in shape.dim]
    if len(dims) < 1 or any(d <= 0 for d in dims):
        return None
    row = 1
    for d in dims[1:]:
        row *= d
    return Table(name=op.name, handle=handle, dtype=dtype, row_bytes=row * dtype.size, rows=dims[0])


def _slots(graph, handles) -> Dict[str, List[object]]:
    """handle op name -> the other resource inputs of the sparse optimizer updates of that variable (its slots,
    updated at the rows the step gathers)."""
    out: Dict[str, List[object]] = {}
    for op in graph.get_operations():
        if not op.type.startswith(("ResourceSparseApply", "SparseApply")) or not op.inputs:
            continue
        var = op.inputs[0]
        if var.op.name not in handles:
            continue
        for t in op.inputs[1:]:
            if _is_variable(t) and t not in out.setdefault(var.op.name, []):
                out[var.op.name].append(t)
    return out


def _touch(tf, x, rows):
    """A gather of `rows` of variable tensor x that reads its pages and writes nothing."""
    if x.dtype.name == "resource":
        return tf.raw_ops.ResourceGather(resource=x, indices=rows, dtype=x.op.get_attr("dtype")).op
    return tf.raw_ops.GatherV2(params=x, indices=rows, axis=0).op   # a ref variable's buffer, read in place


class _Refused(Exception):
    pass


def _collect(tensor, boundary, pipelined, order, seen, external):
    """Walk back from `tensor` to the boundary tensors; `order`: the ops to copy, inputs first. Raises _Refused
    with the reason when the computation cannot be copied read-only."""
    if tensor.name in boundary:   # the staged tensor itself: the put's own value
        external.setdefault(tensor.name, tensor)
        return
    stack = [(tensor.op, False)]
    while stack:
        op, done = stack.pop()
        if done:
            order.append(op)
            continue
        if op.name in seen:
            continue
        seen.add(op.name)
        if op.type in ("Placeholder", "PlaceholderWithDefault"):
            raise _Refused(f"its indices depend on a feed ({op.name})")
        if op.name in pipelined and op.type != "Const":
            raise _Refused(f"its indices read an input-stage tensor that is not staged ({op.name})")
        if op.op_def.is_stateful and op.type not in READ_ONLY:
            raise _Refused(f"its indices come from {op.type} ({op.name}), which writes state")
        stack.append((op, True))
        deps = list(op.inputs)
        if op.type == "ReadVariableOp":   # read + delta: the value an assign_add before it added
            deps += [c.inputs[1] for c in op.control_inputs if c.type == "AssignAddVariableOp"
                     and c.inputs[0] is op.inputs[0]]
        for t in deps:
            if t.name in boundary or t.dtype.name == "resource":
                external.setdefault(t.name, t)
            elif t.op.name not in seen:
                stack.append((t.op, False))


def _node(op, ext_names):
    from tensorflow.core.framework import node_def_pb2

    nd = node_def_pb2.NodeDef()
    nd.CopyFrom(op.node_def)
    nd.ClearField("device")
    if "_class" in nd.attr:   # colocation with ops that are not copied
        del nd.attr["_class"]
    del nd.input[:]
    nd.input.extend(ext_names.get(t.name, t.name if t.value_index else t.op.name) for t in op.inputs)
    return nd


def _graph_def(order, external):
    """A GraphDef of the ops in `order` (original names), each external tensor a Placeholder to be input-mapped.
    A ReadVariableOp ordered after an AssignAddVariableOp of its variable becomes the read plus the amount."""
    from tensorflow.core.framework import graph_pb2, node_def_pb2

    gd = graph_pb2.GraphDef()
    ext_names = {}
    for i, (name, t) in enumerate(sorted(external.items())):
        nd = gd.node.add()
        nd.name, nd.op = f"ext_{i}", "Placeholder"
        nd.attr["dtype"].type = t.dtype.as_datatype_enum
        ext_names[name] = nd.name
    for op in order:
        nd = _node(op, ext_names)
        adds = [c for c in op.control_inputs if op.type == "ReadVariableOp" and c.type == "AssignAddVariableOp"
                and c.inputs[0] is op.inputs[0]]
        if adds:
            base = node_def_pb2.NodeDef()
            base.CopyFrom(nd)
            base.name = nd.name + "/rtkit_read"
            gd.node.append(base)
            amount = adds[0].inputs[1]
            add = gd.node.add()
            add.name, add.op = nd.name, "AddV2"
            add.attr["T"].CopyFrom(nd.attr["dtype"])
            add.input.extend([base.name, ext_names.get(amount.name, amount.name if amount.value_index
                                                       else amount.op.name)])
        else:
            gd.node.append(nd)
    return gd, ext_names


def plan(graph, staged, sm, max_tables: int = 256) -> Tuple[Optional[Plan], Optional[str]]:
    """(Plan, None), or (None, why the lookahead is off for this graph)."""
    return _plan(graph, set(staged.boundary), sm.pipelined, "the staged batch", max_tables)


def plan_feeds(graph, max_tables: int = 256) -> Tuple[Optional[Plan], Optional[str]]:
    """The same for a graph whose steps feed their ids (feed_dict): the gathers whose indices are computed from
    placeholders only. The plan's index tensors are then evaluated on a step's own feeds just before it runs."""
    fed = {t.name for op in graph.get_operations() if op.type == "Placeholder"
           and not op.name.startswith(SCOPE) for t in op.outputs}
    p, why = _plan(graph, fed, set(), "fed tensors", max_tables)
    if p is not None:
        p.fed_inputs = [_fed_inputs(t, fed) for t in p.index_tensors]
    return p, why


def _fed_inputs(tensor, fed) -> Tuple[str, ...]:
    """The placeholders an index tensor (or its copy) is computed from."""
    out, seen, stack = set(), set(), [tensor]
    while stack:
        t = stack.pop()
        if t.name in fed:
            out.add(t.name)
            continue
        if t.op.name in seen:
            continue
        seen.add(t.op.name)
        stack.extend(t.op.inputs)
    return tuple(sorted(out))


def _plan(graph, boundary, pipelined, what: str, max_tables: int) -> Tuple[Optional[Plan], Optional[str]]:
    import tensorflow as tf

    gathers = []
    for op in graph.get_operations():
        if op.type not in GATHERS or op.name.startswith(("gradients", SCOPE, "rtkit_stage")):
            continue
        h = _handle_of(op)
        if h is not None:
            gathers.append((op, h))
    if not gathers:
        return None, "no gather of a table variable in the graph"
    order, seen, external, kept, skipped = [], set(), {}, [], []
    for op, h in gathers:
        o, s, e = list(order), set(seen), dict(external)
        try:
            _collect(op.inputs[1], boundary, pipelined, o, s, e)
        except _Refused as why:
            skipped.append(f"{op.name}: {why}")
            continue
        if not any(n in boundary for n in e):
            skipped.append(f"{op.name}: its indices do not depend on {what}")
            continue
        order, seen, external = o, s, e
        kept.append((op, h))
    if not kept:
        return None, f"no table gather's indices can be computed read-only from {what} (" + \
            "; ".join(skipped[:3]) + ")"
    tables: Dict[str, Table] = {}
    for _, h in kept:
        if h.op.name not in tables and len(tables) < max_tables:
            t = _table(graph, h)
            if t is not None:
                tables[h.op.name] = t
    kept = [(op, h) for op, h in kept if h.op.name in tables]
    if not kept:
        return None, "the gathered tables have no static shape"
    for name, slots in _slots(graph, set(tables)).items():
        tables[name].slots = slots
    # a variable gathered itself that is another gathered table's optimizer slot (a row copy that moves a table's
    # rows with their slot rows, as the EmbeddingVariable analogue's promotion does) is that table's: the same
    # rows, read ahead with it (a table of its own would be looked for twice in the same memory, and found neither time)
    owner = {s.op.name: name for name, t in tables.items() for s in t.slots if s.op.name in tables and s.op.name != name}
    for slot in owner:
        del tables[slot]
    gd, ext_names = _graph_def(order, external)
    was_final = graph.finalized
    if was_final:   # MonitoredTrainingSession: new ops only, before its first step (as the staging rewrite does)
        graph._unsafe_unfinalize()
    try:
        with graph.as_default(), graph.name_scope(None), graph.control_dependencies(None):
            input_map = {ext_names[n]: t for n, t in external.items()}
            # an index tensor that is itself staged is fetched as it is: the put computes it
            wanted = [op.inputs[1].name for op, _ in kept if op.inputs[1].name not in boundary]
            copied = iter(tf.graph_util.import_graph_def(gd, input_map=input_map, return_elements=wanted, name=SCOPE)
                          if order else [])
            idx = [op.inputs[1] if op.inputs[1].name in boundary else next(copied) for op, _ in kept]
            p = Plan(index_tensors=list(idx), table_of_index=[owner.get(h.op.name, h.op.name) for _, h in kept],
                     tables=tables,
                     gather_ops=[op.name for op, _ in kept],
                     skipped=skipped)
            with graph.name_scope(SCOPE + "_touch/"):
                for name, t in tables.items():
                    rows = tf.compat.v1.placeholder(tf.int64, [None], name="rows")
                    p.touch_feeds[name] = rows
                    p.touch_ops[name] = [_touch(tf, x, rows) for x in [t.handle] + t.slots]
    finally:
        if was_final:
            graph.finalize()
    return p, None
