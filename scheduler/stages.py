# stages.py -- classify a TF1 graph's ops into input / embedding / dense / apply stages and find the SmartStage cut.
"""The input stage is DeepRec SmartStage's cut: the iterator's get_next and every stateless op that depends
only on it (and on constants), never on a variable, a feed or a stateful op. Those ops can run steps ahead
without changing what the model sees. The boundary is the set of their output tensors consumed by the rest
of the graph; a step's run reads them from the staging area instead of computing them.

Left out of the cut: shape ops (Shape, ShapeN, Size, Rank), what depends on them, and ops whose outputs only they
read, and the gradient's plumbing (ops under a gradients scope, such as the index reshapes of an embedding's
gradient): the step computes those from the staged tensors, as the script's graph does."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set

STAGES = ("input", "embedding", "dense", "apply", "other")

# Ops that produce the next input element: the sources of the pipelined input stage.
GET_NEXT_TYPES = {"IteratorGetNext", "IteratorGetNextSync", "MultiDeviceIteratorGetNextFromShard"}
# Control flow and function calls hide what runs inside; the cut never crosses them.
OPAQUE_TYPES = {"Switch", "Merge", "Enter", "Exit", "NextIteration", "LoopCond", "RefSwitch", "RefMerge",
                "RefEnter", "RefExit", "RefNextIteration", "If", "StatelessIf", "While", "StatelessWhile",
                "PartitionedCall", "StatefulPartitionedCall", "Case", "StatelessCase"}
FEED_TYPES = {"Placeholder", "PlaceholderV2", "PlaceholderWithDefault"}
# A TF1 input queue's reads: its queue runners' threads already fill it ahead of the step.
DEQUEUE_TYPES = {"QueueDequeue", "QueueDequeueV2", "QueueDequeueMany", "QueueDequeueManyV2", "QueueDequeueUpTo",
                 "QueueDequeueUpToV2"}
# Shape plumbing stays in the step, which computes it from the staged tensors as the script's graph does: staged,
# each shape was one more boundary tensor that reached the model as opaque data (on the lazy-table wdl 182 of 237
# were shapes and gradient indices). It is not what makes lazy-table losses differ in the last bit: measured with
# and without it in the cut, the difference is the same (docs/scheduler.md, "Bit-identical losses depend on the graph").
SHAPE_TYPES = {"Shape", "ShapeN", "Size", "Rank"}
# rtkit's own staging ops (the put, the get and the clear of the staging area) are input-stage work.
STAGE_OP_TYPES = {"Stage", "Unstage", "StageClear", "StageSize", "StagePeek"}
_EMBED_RE = re.compile(r"^(Lookup|MutableHashTable|MutableDenseHashTable|HashTable|Unique|Gather|ResourceGather|"
                       r"Scatter|ResourceScatter|SparseSegment|UnsortedSegment|SparseApply|ResourceSparseApply|"
                       r"KvResource|EmbeddingVar|InitializeTable|DynamicPartition|DynamicStitch|ParallelDynamicStitch)")
_APPLY_RE = re.compile(r"^(Apply|ResourceApply|Assign|AssignAdd|AssignSub|AssignVariableOp|AssignAddVariableOp|"
                       r"AssignSubVariableOp)")


def _is_stateful(op) -> bool:
    try:
        return bool(op.op_def.is_stateful)
    except Exception:  # ops without a registered OpDef: be conservative
        return True


def _in_gradients(name: str) -> bool:
    return any(p == "gradients" or p.startswith("gradients_") for p in name.split("/"))


def _forward_name(name: str) -> Optional[str]:
    """'gradients/a/b_grad/Reshape' -> 'a/b': the forward op a gradient op was built for."""
    parts = name.split("/")
    if not any(p == "gradients" or p.startswith("gradients_") for p in parts):
        return None
    for i in range(len(parts) - 1, -1, -1):
        if parts[i].endswith("_grad"):
            fwd = [p for p in parts[:i] if not (p == "gradients" or p.startswith("gradients_"))]
            return "/".join(fwd + [parts[i][: -len("_grad")]])
    return None


def _no_iterator_note(ops) -> str:
    """Why nothing is cut, naming what the graph's input is instead of a tf.data iterator."""
    dequeues = sorted({op.type for op in ops if op.type in DEQUEUE_TYPES})
    if dequeues:
        return (f"no tf.data iterator get_next in the graph: the input is a queue ({', '.join(dequeues)}), which its "
                "queue runners already fill ahead of the step; the input stage cannot be cut")
    if any(op.type in FEED_TYPES for op in ops):
        return "no tf.data iterator get_next in the graph: the input stage cannot be cut (feeds only)"
    return "no tf.data iterator get_next and no feed in the graph: the input stage cannot be cut"


@dataclass
class StageMap:
    stage: Dict[str, str]                    # op name -> stage
    pipelined: Set[str]                      # op names of the cut's input side (run ahead)
    boundary: List[str]                      # tensor names crossing from the cut into the rest
    support: Set[str]                        # iterator/dataset ops upstream of get_next (init, save...)
    cuttable: bool
    resets: Set[str] = field(default_factory=set)  # stateful support ops: a run reaching one acts on the iterator
    notes: List[str] = field(default_factory=list)

    def counts(self) -> Dict[str, int]:
        out = {s: 0 for s in STAGES}
        for s in self.stage.values():
            out[s] += 1
        return out


def analyze(graph) -> StageMap:
    ops = graph.get_operations()  # creation order is a topological order for non-loop graphs
    by_name = {op.name: op for op in ops}
    notes: List[str] = []
    stage: Dict[str, str] = {}

    # 1. constants: stateless ops with no input at all, or whose inputs are all constant
    const: Set[str] = set()
    for op in ops:
        if op.type in FEED_TYPES or op.type in OPAQUE_TYPES or _is_stateful(op):
            continue
        if all(t.op.name in const for t in op.inputs) and all(c.name in const for c in op.control_inputs):
            const.add(op.name)

    # 2. the pipelined set: get_next plus stateless ops fed only by it and by constants
    sources = [op for op in ops if op.type in GET_NEXT_TYPES]
    pipelined: Set[str] = {op.name for op in sources}
    for op in ops:
        if op.name in pipelined or op.name in const:
            continue
        if _is_stateful(op) or op.type in OPAQUE_TYPES or op.type in FEED_TYPES:
            continue
        if op.type in SHAPE_TYPES or _in_gradients(op.name):
            continue
        ins = [t.op.name for t in op.inputs] + [c.name for c in op.control_inputs]
        if ins and all(n in pipelined or n in const for n in ins) and any(n in pipelined for n in ins):
            pipelined.add(op.name)
    # an op whose outputs only shape ops read is shape plumbing too: the step computes it
    for op in reversed(ops):
        if op.name not in pipelined or op.type in GET_NEXT_TYPES:
            continue
        consumers = [c for t in op.outputs for c in t.consumers()]
        if consumers and all(c.type in SHAPE_TYPES and c.name not in pipelined for c in consumers):
            pipelined.discard(op.name)

    # 3. support: everything upstream of get_next (iterator handle, dataset ops, MakeIterator shares the handle)
    support: Set[str] = set()
    stack = [t.op for s in sources for t in s.inputs] + [c for s in sources for c in s.control_inputs]
    while stack:
        op = stack.pop()
        if op.name in support:
            continue
        support.add(op.name)
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
    handles = {n for n in support if by_name[n].type in ("Iterator", "IteratorV2", "AnonymousIteratorV2",
                                                          "AnonymousIteratorV3", "OneShotIterator")}
    for op in ops:  # MakeIterator / save / deserialize ops that take the iterator handle
        if op.name not in pipelined and any(t.op.name in handles for t in op.inputs):
            support.add(op.name)
            for t in op.inputs:
                if t.op.name not in support:
                    support.add(t.op.name)

    # Constants upstream of the dataset may be shared with the model; only stateful ops (the iterator,
    # MakeIterator, iterator save/restore) mean that a run acts on the iterator itself.
    resets = {n for n in support if _is_stateful(by_name[n])}

    # 4. boundary tensors and the checks that make the cut safe
    boundary: List[str] = []
    seen: Set[str] = set()
    cuttable = bool(sources)
    if not sources:
        notes.append(_no_iterator_note(ops))
    for op in ops:
        if op.name in pipelined:
            continue
        for c in op.control_inputs:
            if c.name in pipelined:
                cuttable = False
                notes.append(f"op {op.name} has a control dependency on input-stage op {c.name}: "
                             "the cut cannot move it ahead")
        for t in op.inputs:
            if t.op.name in pipelined and t.name not in seen:
                seen.add(t.name)
                boundary.append(t.name)
                if not graph.is_feedable(t):
                    cuttable = False
                    notes.append(f"boundary tensor {t.name} is not feedable")
    for src in sources:  # get_next outputs nobody consumes in-graph may still be fetched directly
        for t in src.outputs:
            if t.name not in seen and not t.consumers():
                seen.add(t.name)
                boundary.append(t.name)
    if cuttable and not boundary:
        cuttable = False
        notes.append("the input stage has no consumer in the graph")

    # 5. stages
    for op in ops:
        n = op.name
        if n in pipelined or n in support or (op.type in STAGE_OP_TYPES and n.startswith("rtkit_stage")):
            stage[n] = "input"
        elif n in const:
            stage[n] = "other"
        elif _EMBED_RE.match(op.type):
            stage[n] = "embedding"
        elif _APPLY_RE.match(op.type):
            stage[n] = "apply"
        else:
            stage[n] = "dense"
    for op in ops:  # gradients of embedding ops are embedding work too
        if stage[op.name] == "dense":
            fwd = _forward_name(op.name)
            if fwd and stage.get(fwd) == "embedding":
                stage[op.name] = "embedding"
    return StageMap(stage=stage, pipelined=pipelined, boundary=boundary, support=support,
                    resets=resets, cuttable=cuttable, notes=notes)


def reachable(graph, fetch_ops, fed_tensors: Set[str], stop: Set[str]) -> Set[str]:
    """Op names the run of `fetch_ops` needs, walking inputs and control inputs, not past fed tensors,
    and not past ops in `stop` (which are included in the result when reached)."""
    out: Set[str] = set()
    stack = list(fetch_ops)
    while stack:
        op = stack.pop()
        if op.name in out:
            continue
        out.add(op.name)
        if op.name in stop:
            continue
        for t in op.inputs:
            if t.name not in fed_tensors:
                stack.append(t.op)
        stack.extend(op.control_inputs)
    return out
