# pipeline.py -- SmartStage: run the input stage steps ahead in a background thread into a bounded queue.
"""One Pipeline per (session, boundary). The background thread runs the boundary tensors (its own
Session.run on the input pool) and queues the values in order; each step's run takes the next item and
feeds it. An error from the input run (OutOfRangeError at the end of data, or any other) is queued in its
place, so it reaches the user's run exactly at the step that would have raised it; the thread then ends.
The thread holds the session only through a weak reference, so a session dropped without close() is
still collected."""
from __future__ import annotations

import queue
import threading
import time
from typing import Callable, Dict, List, Optional

_counter = 0
_counter_lock = threading.Lock()
THREAD_PREFIX = "rtkit-stage"


class Pipeline:
    def __init__(self, boundary: List, depth: int, run_input: Callable[[List], List],
                 on_event: Optional[Callable[[str, float, float, Dict], None]] = None):
        global _counter
        with _counter_lock:
            _counter += 1
            self.ident = _counter
        self.boundary = list(boundary)          # tf.Tensor objects, fed in this order
        self.depth = max(1, int(depth))
        self._run_input = run_input             # fetch list -> list of numpy values (raises TF errors)
        self._on_event = on_event
        # Unbounded queue, bounded by _space: on halt() the in-flight batch must still be queued even
        # when `depth` batches are waiting, since the step side (the only consumer) is the halting thread.
        self._q: "queue.Queue" = queue.Queue()
        self._space = threading.Semaphore(self.depth)
        self._stop = threading.Event()
        self._halt = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.produced = 0
        self.consumed = 0
        self.occupancy: List[int] = []          # items ready when a step asked (0 = the step waited)
        self.wait_ms: List[float] = []

    # -- background side
    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=f"{THREAD_PREFIX}-{self.ident}", daemon=True)
        self._thread.start()

    def _put(self, item) -> bool:
        if self._stop.is_set():
            return False
        self._q.put(item)
        return True

    def _wait_space(self) -> bool:
        while not (self._stop.is_set() or self._halt.is_set()):
            if self._space.acquire(timeout=0.05):
                return True
        return False

    def _loop(self) -> None:
        seq = 0
        while self._wait_space():
            t0 = time.time()
            try:
                values = self._run_input(self.boundary)
            except BaseException as exc:  # delivered to the step that would have raised it
                if self._stop.is_set():
                    return
                self._put(("err", seq, exc))
                return
            t1 = time.time()
            if self._on_event:
                self._on_event("input_run", t0, t1, {"seq": seq})
            if not self._put(("ok", seq, values)):
                return
            self.produced += 1
            seq += 1

    # -- step side
    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def next_feed(self) -> Dict:
        """The feeds for the next step; re-raises the input stage's error at its step."""
        self.occupancy.append(self._q.qsize())
        t0 = time.time()
        while True:
            try:
                kind, seq, payload = self._q.get(timeout=0.1)
                break
            except queue.Empty:
                if not self.alive and self._q.empty():
                    raise RuntimeError("rtkit scheduler: the input pipeline thread ended without a result")
        t1 = time.time()
        self._space.release()
        self.wait_ms.append((t1 - t0) * 1000.0)
        if self._on_event and t1 - t0 > 0.0005:
            self._on_event("wait_input", t0, t1, {"seq": seq})
        if kind == "err":
            raise payload
        self.consumed += 1
        return dict(zip(self.boundary, payload))

    def halt(self, timeout_s: float = 60.0) -> None:
        """Stop producing but keep what is queued (the in-flight batch included): the step side drains it."""
        self._halt.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def stop(self, timeout_s: float = 60.0) -> int:
        """Stop the thread and drop what it prefetched. Returns the number of dropped batches."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        dropped = 0
        while True:
            try:
                kind, _, _ = self._q.get_nowait()
                dropped += kind == "ok"
            except queue.Empty:
                break
        return dropped

    @property
    def finished(self) -> bool:
        """The thread has ended and every item it queued has been taken."""
        return self._thread is not None and not self._thread.is_alive() and self._q.empty()
