# staging.py -- SmartStage in the graph: route the cut's boundary tensors through a StagingArea (put ahead, get in the step).
"""rewrite(graph, stage_map, depth) adds one StagingArea to the graph: a put op whose inputs are the
boundary tensors and a get op with one output per boundary tensor. It changes no op the script made: the
script's own fetches still run the script's own graph (the unstaged step costs what it cost without rtkit).
A staged step runs the same fetches as a callable whose CallableOptions.tensor_connection edges replace each
boundary tensor with the get op's output, so its consumers read the staging area in that executor only. The put
runs ahead in a background Runner on the input pool. The staged tensors never leave the runtime (no feed, no
host copy through Python).

A graph the rewrite cannot handle is left exactly as it is and the reason is returned."""
from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

from .stages import GET_NEXT_TYPES, OPAQUE_TYPES, StageMap

SCOPE = "rtkit_stage"
STAGING_TYPES = {"Stage", "Unstage", "StagePeek", "StageSize", "StageClear", "MapStage", "MapUnstage",
                 "OrderedMapStage", "OrderedMapUnstage", "MapUnstageNoKey", "OrderedMapUnstageNoKey"}
_UNSTAGEABLE_DTYPES = ("resource", "variant")
RUNNER_PREFIX = "rtkit-stage"


@dataclass
class Staged:
    """What rewrite() added: the put op, the get op, and original boundary tensor name -> the get's output that a
    staged step connects in its place."""
    put: object
    get_op: object
    clear: object
    mapping: Dict[str, object]
    boundary: List[str]
    connected: int = 0          # consumer inputs a staged step reads from the get op's outputs
    get_name: str = ""
    # the read-ahead area: get_next's outputs staged by a reader, read by the cut's put through tensor connections
    # (None when the cut is get_next alone, or an output cannot be staged)
    read_put: object = None
    read_clear: object = None
    read_mapping: Dict[str, object] = field(default_factory=dict)   # get_next output name -> the read get's output
    read_source: str = ""       # the get_next op a reader runs ahead (its op time in a traced put is the read)


def check(graph, sm: StageMap) -> Optional[str]:
    """None when the graph can be rewritten, else the reason it is left as it is."""
    if not sm.cuttable:
        return "; ".join(sm.notes) or "the input stage cannot be cut"
    sources = []
    for op in graph.get_operations():
        if op.type in STAGING_TYPES:
            return f"the graph already has a staging op ({op.name}, {op.type}): the script stages itself"
        if op.type in GET_NEXT_TYPES:
            sources.append(op.name)
    if len(sources) > 1:
        # one put over all of them would advance every iterator (an eval input too) at every step
        return (f"{len(sources)} iterator get_next ops in the graph ({', '.join(sources[:3])}): "
                "one staging area would advance them all at every step")
    for name in sm.boundary:
        t = graph.get_tensor_by_name(name)
        if t.dtype.name in _UNSTAGEABLE_DTYPES or t.dtype._is_ref_dtype:
            return f"boundary tensor {name} has dtype {t.dtype.name}, which a StagingArea cannot hold"
        for c in t.consumers():
            if c.name not in sm.pipelined and c.type in OPAQUE_TYPES:
                return f"boundary tensor {name} feeds control flow ({c.name}, {c.type}): the cut is not moved"
    return None


def rewrite(graph, sm: StageMap, depth: int) -> Tuple[Optional[Staged], Optional[str]]:
    """Add the staging area (new ops only, no existing op changed); (None, reason) when the graph is left as is."""
    reason = check(graph, sm)
    if reason:
        return None, reason
    from tensorflow.python.ops import data_flow_ops

    bnd = [graph.get_tensor_by_name(n) for n in sm.boundary]
    was_final = graph.finalized
    if was_final:  # MonitoredTrainingSession finalizes before creating its session; new ops only, before its first step
        graph._unsafe_unfinalize()
    try:
        with graph.as_default(), graph.name_scope(None), graph.name_scope(SCOPE), graph.control_dependencies(None):
            # the runner keeps at most `depth` items ahead; +1: the step that took an item may not have run
            # its get yet when the next put lands
            area = data_flow_ops.StagingArea([t.dtype for t in bnd], capacity=max(1, int(depth)) + 1,
                                             shared_name=None)
            put = area.put(bnd)
            got = area.get()
            got = list(got) if isinstance(got, (list, tuple)) else [got]
            clear = area.clear()
            read = _read_area(graph, sm, depth)
        mapping = {}
        for t, g in zip(bnd, got):
            g.set_shape(t.shape)
            mapping[t.name] = g
        staged = Staged(put=put, get_op=got[0].op, clear=clear, mapping=mapping, boundary=list(sm.boundary),
                        get_name=got[0].op.name)
        if read is not None:
            staged.read_put, staged.read_clear, staged.read_mapping, staged.read_source = read
        # no consumer is rewired (the script's graph runs as it was); a staged step connects them per run
        staged.connected = sum(1 for t in bnd for c in t.consumers() if c.name not in sm.pipelined and c is not put
                               and c is not staged.read_put for x in c.inputs if x.name == t.name)
        return staged, None
    finally:
        if was_final:
            graph.finalize()


def _read_area(graph, sm: StageMap, depth: int):
    """(put, clear, {get_next output name: the read get's output}, get_next's name) of a second area holding
    get_next's outputs, or None: only where the cut does work after get_next (in-graph parsing) for a reader to
    run ahead of."""
    from tensorflow.python.ops import data_flow_ops

    sources = [graph.get_operation_by_name(n) for n in sm.pipelined
               if graph.get_operation_by_name(n).type in GET_NEXT_TYPES]
    if len(sources) != 1 or len(sm.pipelined) <= 1:
        return None
    outs = list(sources[0].outputs)
    if not outs or any(t.dtype.name in _UNSTAGEABLE_DTYPES or t.dtype._is_ref_dtype for t in outs):
        return None
    area = data_flow_ops.StagingArea([t.dtype for t in outs], capacity=max(1, int(depth)) + 1, shared_name=None)
    put = area.put(outs)
    got = area.get()
    got = list(got) if isinstance(got, (list, tuple)) else [got]
    for t, g in zip(outs, got):
        g.set_shape(t.shape)
    return put, area.clear(), {t.name: g for t, g in zip(outs, got)}, sources[0].name


class ReadAhead:
    """A reader thread runs the read put (get_next's outputs into the read area) up to `depth` batches ahead, and the
    Runner stages each next batch by decoding a read one (the cut's put on it) or, with none read or being read, by
    its own plain put. The plain put and a read never run at once (the `plain` and `reading` flags, under one
    condition), and the Runner alone stages, in order: the steps see the batches in the iterator's order. The
    reader's input error is raised after the batches read before it are staged. No TF op here blocks on an empty or
    full area: the counts are checked first."""

    def __init__(self, run_read: Callable[[], None], run_decode: Callable[[], None], run_clear: Callable[[], None],
                 depth: int):
        self.depth = max(1, int(depth))
        self._run_read, self._run_decode, self._run_clear = run_read, run_decode, run_clear
        self.cond = threading.Condition()
        self.on = False                # the configuration applied now reads ahead
        self.reads = self.decoded = 0
        self.reading = False           # a read is in flight (its batch will need a decode)
        self.plain = False             # the Runner's plain put is in flight: no read may start
        self.error: Optional[BaseException] = None
        self._halt = False
        self._thread: Optional[threading.Thread] = None

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def pending(self) -> int:
        """Batches taken from the iterator that are not staged yet (the one being read included)."""
        with self.cond:
            return self.reads - self.decoded + (1 if self.reading else 0)

    def start(self, ident: int) -> None:
        self._halt = False
        if not self.alive:
            self._thread = threading.Thread(target=self._loop, name=f"{RUNNER_PREFIX}-read-{ident}", daemon=True)
            self._thread.start()

    def halt(self) -> None:
        self._halt = True

    def prepare(self) -> None:
        """Build the decode's callable now (an executor: a second or so on wdl), before it is timed."""
        build = getattr(self._run_decode, "prepare", None)
        if build is not None:
            build()

    def _loop(self) -> None:
        try:
            while True:
                with self.cond:
                    while not self._halt and (self.plain or self.reads - self.decoded >= self.depth):
                        self.cond.wait(0.05)
                    if self._halt or self.error is not None:
                        return
                    self.reading = True
                try:
                    self._run_read()
                except BaseException as exc:  # raised where the batches read before it are staged
                    with self.cond:
                        self.error = exc
                    return
                finally:
                    with self.cond:
                        self.reading = False
                with self.cond:
                    self.reads += 1
                    self.cond.notify_all()   # the Runner may be waiting for this batch: left to its wait's timeout,
                                             # each batch would wait up to 50 ms more, slower than no read-ahead
        finally:
            with self.cond:
                self.cond.notify_all()

    def stage_next(self, run_plain: Callable[[], None], prefer_read: bool, stopping: Callable[[], bool]) -> bool:
        """Stage the next batch: decode the oldest read one; or wait for the read in flight (or, with
        prefer_read, for the running reader's next); or else run the plain put with reads held off. False when
        `stopping()` said to stop first."""
        with self.cond:
            while True:
                if stopping():
                    return False
                if self.reads > self.decoded:
                    decode = True
                    break
                if self.error is not None:
                    exc, self.error = self.error, None
                    raise exc
                if self.reading or (prefer_read and self.alive and not self._halt):
                    self.cond.wait(0.05)
                    continue
                decode, self.plain = False, True
                break
        if not decode:
            try:
                run_plain()
            finally:
                with self.cond:
                    self.plain = False
                    self.cond.notify_all()
            return True
        self._run_decode()
        with self.cond:
            self.decoded += 1
            self.cond.notify_all()
        return True

    def stop(self, timeout_s: float) -> int:
        """Stop reading and drop what was read (after the Runner stopped): returns the dropped batches."""
        self._halt = True
        if self._thread is not None:
            self._thread.join(timeout_s)
        try:
            self._run_clear()
        except Exception:
            pass
        with self.cond:
            dropped = max(0, self.reads - self.decoded)
            self.reads = self.decoded = 0
            self.error = None
        return dropped


class Runner:
    """Runs the put op over and over on the input pool, at most `depth` items ahead (the area's capacity).

    puts/gets count items; an input error (OutOfRangeError at the end of the data, a bad record) is kept
    with the number of items put before it, so the step side raises it at exactly the step that would
    have raised it unstaged."""

    def __init__(self, run_put: Callable[[], None], run_clear: Callable[[], None],
                 on_event: Optional[Callable[[str, float, float, Dict], None]] = None, depth: int = 2,
                 read_ahead: Optional[ReadAhead] = None):
        self.depth = max(1, int(depth))
        self.read_ahead = read_ahead
        self._stopping = False
        self._run_put = run_put
        self._run_clear = run_clear
        self._on_event = on_event
        self.cond = threading.Condition()
        self.puts = 0
        self.gets = 0
        self.error: Optional[BaseException] = None
        self._halt = False
        self._thread: Optional[threading.Thread] = None
        self.depth_samples: List[Tuple[float, int]] = []   # (time, items staged) when a step took one
        self._items: "collections.deque" = collections.deque()  # put ms of each staged item, FIFO

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, ident: int) -> None:
        self._halt = self._stopping = False
        self._thread = threading.Thread(target=self._loop, name=f"{RUNNER_PREFIX}-{ident}", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            # wait for room here, not inside the Stage op: a put's time is then its own work (the overlap
            # figures), and a put never holds an input-pool thread blocked on a full area
            # halted, it still decodes the batches the read-ahead took from the iterator: they come before
            # whatever the step reads itself next
            with self.cond:
                while not self._stopping and (not self._halt or self._pending()) and \
                        self.puts - self.gets >= self.depth:
                    self.cond.wait(0.05)
                if self._stopping or (self._halt and not self._pending()):
                    return
            t0 = time.time()
            ra = self.read_ahead
            try:
                if ra is None:
                    self._run_put()
                elif not ra.stage_next(self._run_put, ra.on and not self._halt, lambda: self._stopping):
                    return
            except BaseException as exc:  # delivered at its step
                with self.cond:
                    if not self._stopping:
                        self.error = exc
                    self.cond.notify_all()
                return
            self._staged(t0, time.time(), {})

    def put_now(self, stage: str = "input") -> float:
        """One put in the caller's thread while the runner's thread is not running and nothing is staged (a probe
        step: the put alone, then the step's compute alone, serially as an unstaged step runs them): the item is
        the next one in the iterator's order, staged for the caller's step, run on the pool of `stage` (a probe's
        put runs where the unstaged step would run it). Returns the put's ms; an input error raises here, at the step
        that would have raised it unstaged."""
        t0 = time.time()
        self._run_put(stage)
        t1 = time.time()
        self._staged(t0, t1, {"probe": True})
        return (t1 - t0) * 1000.0

    def _staged(self, t0: float, t1: float, args: Dict) -> None:
        """A put from t0 to t1 staged its item."""
        with self.cond:
            self.puts += 1
            self._items.append((t1 - t0) * 1000.0)
            self.cond.notify_all()
        if self._on_event:
            self._on_event("put", t0, t1, {"item": self.puts, **args})

    def take(self) -> Tuple[str, float, float]:
        """Before a step's run that reads the input: ('ready', put ms of the item, wait ms) when an item is
        staged, or ('inline', 0, wait ms) when nothing is staged and nothing will come (the step then runs the
        script's own graph, which reads the iterator itself); raises the input error at its step."""
        t0 = time.time()
        with self.cond:
            self.wait_item()
            self.depth_samples.append((t0, self.puts - self.gets))
            put_ms = 0.0
            if self.puts > self.gets:
                self.gets += 1
                self.cond.notify_all()  # room for the runner's next put
                state = "ready"
                put_ms = self._items.popleft() if self._items else 0.0
            elif self.error is not None:
                exc, self.error = self.error, None
                raise exc
            else:
                state = "inline"
        t1 = time.time()
        if self._on_event and t1 - t0 > 0.0005:
            self._on_event("wait", t0, t1, {"item": self.gets})
        return state, put_ms, (t1 - t0) * 1000.0

    def _pending(self) -> int:
        return self.read_ahead.pending() if self.read_ahead is not None else 0

    def wait_item(self) -> None:
        """Wait until an item is staged, an input error is kept, or nothing will come: the runner and its reader
        have both ended (a reader still running may hold a batch only this runner would stage). take() waits so,
        and so does a probe step before it decides between the staged item and its own put: it never falls back
        to the script's graph because the runner was still ending when it looked (a thread's exit notifies
        nothing, so each wait is short and looks again)."""
        ra = self.read_ahead
        with self.cond:
            while self.puts <= self.gets and self.error is None and \
                    (self.alive or (ra is not None and ra.alive)):
                self.cond.wait(0.05)

    def halt(self) -> None:
        """Stop putting (the in-flight put completes when a step takes an item; batches read ahead are still
        decoded); staged items stay. The reader is halted first: halted before it, the runner could find nothing
        read, end, and leave a batch the reader then took from the iterator undecoded, out of the steps' order."""
        if self.read_ahead is not None:
            self.read_ahead.halt()
        self._halt = True

    def stop(self, timeout_s: float = 30.0) -> int:
        """Stop the thread and drop what is staged (a reset of the iterator): returns the dropped items."""
        self._halt = self._stopping = True
        if self.read_ahead is not None:
            self.read_ahead.halt()
        deadline = time.time() + timeout_s
        while self.alive and time.time() < deadline:
            try:  # a put blocked on a full area returns once the area is cleared
                self._run_clear()
            except Exception:
                break
            self._thread.join(0.05)
        try:
            self._run_clear()
        except Exception:
            pass
        if self.read_ahead is not None:  # the decoder has stopped: what was read can go
            read_dropped = self.read_ahead.stop(max(0.0, deadline - time.time()))
        else:
            read_dropped = 0
        with self.cond:
            dropped = max(0, self.puts - self.gets) + read_dropped
            self.puts = self.gets = 0
            self.error = None
            self._items.clear()
        return dropped
