# lookahead.py -- make the rows a step gathers resident before it runs (the next staged batch's, or a step's fed ids) and count it.
"""Each put of the staging runner also fetches the row ids its batch will gather (lookahead_graph's read-only
copy of the index computation, evaluated on the same boundary tensors in the same run), so each staged item has
its rows, in the staging area's order. When a step takes its item, the worker touches the rows of the next item
only (at most one batch ahead, at most `max_rows` rows): a ResourceGather of those rows of each table and its
optimizer slots on a separate callable of the same session, which pages them in and writes no table memory.

Accounting, per batch: rows and pages requested ahead; just before the step runs, the pages of its rows found
resident (mincore, on the tables found in the pool, lookahead_pages), late (the worker had not finished that batch
when the step took it) and wasted (resident after the touch, out again at the step); bytes requested ahead; the
worker's CPU seconds (its thread's clock); the pages told to the tier's resident budget (lookahead_pages.tell_budget)
before they are read ahead, so that its next step mark keeps them. Mode "measure" computes and checks the rows and
touches nothing (and tells nothing): the share resident without the lookahead, on the same steps.

A script that feeds its ids (feed_dict) has no next batch to look at: on_feed takes the rows of the step about to
run from its own feeds and asks for their pages at once, with no worker."""
from __future__ import annotations

import collections
import threading
import time
from typing import Callable, Dict, List, Optional

import numpy as np

from . import lookahead_pages as pages

FIND_PER_BATCH = 256      # tables (each with its slots) looked for in the pool per try
FIND_ROWS = 64            # rows of a table (and of its slots) whose values are looked for, spread over the batch's
FIND_TRIES = 2            # steps before which the pool is searched in full (its records, then its resident pages)
# ... then, for what is still not found, its records alone before batches 16, 32, 64, ... (FIND_RETRIES at most): an
# optimizer slot is a constant at first (Adagrad's 0.1), and its rows tell it from the other slots of its size only
# once steps have moved them (at full scale 24 of the capacity bench's 26 deep slots were not found in the first two)
FIND_RETRY_FIRST = 16
FIND_RETRIES = 10
# slots left to pair by the pages the steps wrote before the pager's heat scans have aged any (they start a few scans
# before its limit): asked again once it has run this many more, without spending a retry (the full-scale bench's
# retry at batch 1,024 came a step before its first scan, the next was due at 2,048: its 24 slots came back at faults)
PAIR_AFTER_SCANS = 2


# Backing off when the steps' pages are in DRAM already: the lookahead costs its own time on every batch (its rows'
# page numbers, residency checks: ~15-20 ms of CPU a batch at the capacity bench's 100 regions, and 0.5-1 ms of a
# step on word2vec_basic.py) and saves about a page read per page it reads ahead. Over the last QUIET_STEPS batches
# looked at, fewer than QUIET_PAGES pages a batch read ahead: only every second batch is looked at, then every
# fourth ... up to every MAX_EVERY-th; twice QUIET_PAGES a batch over the window looks twice as often again, and one
# batch looked at that reads RESUME_PAGES or more (rows of pages evicted or not used before) brings it back to every
# batch. So a table that fits in DRAM (the first half of a run past DRAM, before anything is evicted) costs ~1/64th.
QUIET_STEPS = 16
QUIET_PAGES = 4
MAX_EVERY = 64
RESUME_PAGES = 4 * QUIET_PAGES


class BackOff:
    """Which batches the lookahead looks at (see QUIET_PAGES), from the pages it read ahead for those it did."""

    def __init__(self):
        self.every = 1
        self._seen = 0
        self._reads: "collections.deque" = collections.deque(maxlen=QUIET_STEPS)

    def looks(self) -> bool:
        """Whether the next batch is looked at (each call is a batch)."""
        self._seen += 1
        return self._seen % self.every == 0

    def read(self, pages_read: int) -> None:
        """A batch looked at read this many pages ahead."""
        if pages_read >= RESUME_PAGES:
            self.every = 1
            self._reads.clear()
            return
        self._reads.append(pages_read)
        if len(self._reads) < QUIET_STEPS:
            return
        if sum(self._reads) < QUIET_PAGES * QUIET_STEPS:
            self.every = min(MAX_EVERY, self.every * 2)
            self._reads.clear()
        elif sum(self._reads) >= 2 * QUIET_PAGES * QUIET_STEPS:   # reading ahead pays again: twice as often
            self.every = max(1, self.every // 2)
            self._reads.clear()


def _timed_wait(cond: threading.Condition, done: Callable[[], bool], limit_s: float) -> float:
    """Wait on `cond` (held) until done() or limit_s; the seconds waited."""
    t0 = time.perf_counter()
    cond.wait_for(done, timeout=limit_s)
    return time.perf_counter() - t0


class _Batch:
    def __init__(self, rows: Optional[Dict[str, np.ndarray]] = None,
                 make_rows: Optional[Callable[[], Dict[str, np.ndarray]]] = None):
        self._rows = rows
        self._make_rows = make_rows   # a staged batch's rows are made by the first to need them (the worker)
        self.done = False           # the worker finished it (touched, or measure mode: nothing to touch)
        self.started = False
        self.skipped = False        # backing off: not looked at, not checked
        self.after: Dict[str, np.ndarray] = {}   # page numbers resident right after the touch, per region
        # ("table#region", page numbers of its rows) of the regions found in the pool, as the worker computed them:
        # the step's check reuses them (None: not computed, the step computes them)
        self.pages: Optional[List] = None

    @property
    def rows(self) -> Dict[str, np.ndarray]:
        if self._rows is None:
            self._rows = self._make_rows()
        return self._rows


class Lookahead:
    def __init__(self, plan, mode: str, max_rows: int, pool_path: str,
                 run_touch: Callable[[Dict[str, np.ndarray], bool], List], thread_name: Optional[str],
                 wait_s: float = 0.0):
        """thread_name None: no worker (fed rows: on_feed asks for a step's pages itself, just before it runs)."""
        self.plan = plan
        self.mode = mode                       # "on" or "measure"
        self.max_rows = int(max_rows)
        self.wait_s = float(wait_s)            # sched_lookahead_wait_ms: a step waits this long at most for its batch
        self.pool = pages.pool_range(pool_path)
        self._run_touch = run_touch            # (rows per table, fetch values) -> values per table when fetched
        self.cond = threading.Condition()
        self.items: "collections.deque[_Batch]" = collections.deque()
        # table -> base of the variable and of each slot in the pool (None: not found); absent: not looked for yet
        self.bases: Dict[str, List[Optional[int]]] = {}
        self._find_tries = 0
        self._pair_after_scans = 0             # no retry before the pager's heat scans reach this (slots waiting)
        self._row_bytes_of: Dict = {}
        self.back_off = BackOff()
        self.current: Dict[str, np.ndarray] = {}
        self._stop = False
        self.counts = {"batches": 0, "batches_touched": 0, "rows_requested": 0, "rows_capped": 0,
                       "pages_requested": 0, "bytes_requested": 0, "batches_measured": 0, "pages_checked": 0,
                       "pages_resident": 0, "late_batches": 0, "wasted_pages": 0, "worker_cpu_s": 0.0,
                       "find_s": 0.0, "wait_s": 0.0, "errors": 0, "budget_pages_told": 0, "budget_batches_untold": 0,
                       "before_s": 0.0, "pages_read_ahead": 0, "skipped_steps": 0, "regions_paired": 0}
        self.error: Optional[str] = None
        self._thread = None
        if thread_name is not None:
            self._thread = threading.Thread(target=self._loop, name=thread_name, daemon=True)
            self._thread.start()

    # ---------------------------------------------------------------- the runner's side
    def wants_rows(self) -> bool:
        """Whether the batch the next put stages is looked at (mode on: the back-off decides; measure: every batch).
        Asked before the put: a put whose batch is not looked at runs without the copied index computation (a
        read-only lookup of every table's ids: ~4 ms a step at the capacity bench's full scale, on every step of
        its first half, where the lookahead backs off), and is staged with on_put_unlooked."""
        if self.mode != "on":
            return True
        with self.cond:
            return self.back_off.looks()

    def on_put_unlooked(self) -> None:
        """A put staged a batch the lookahead does not look at (backing off): not looked at, not checked."""
        b = _Batch(rows={})
        b.skipped = b.started = b.done = True
        with self.cond:
            self.items.append(b)
            self.cond.notify_all()

    def on_put(self, index_values: List[np.ndarray]) -> None:
        """A put staged its batch; index_values: the copied index tensors' values, in plan order."""
        # the rows (unique per table) are made off the staging thread, by the worker, and only for batches looked at
        b = _Batch(make_rows=lambda: self._rows_of(index_values))
        with self.cond:
            self.items.append(b)
            self.cond.notify_all()

    def _rows_of(self, index_values: List[np.ndarray]) -> Dict[str, np.ndarray]:
        """Each table's unique rows in range, at most max_rows in all (the rest counted as capped)."""
        rows: Dict[str, List[np.ndarray]] = {}
        for name, v in zip(self.plan.table_of_index, index_values):
            rows.setdefault(name, []).append(np.asarray(v, dtype=np.int64).ravel())
        merged, total, capped = {}, 0, 0
        for name, parts in rows.items():
            t = self.plan.tables[name]
            r = pages.distinct(np.concatenate(parts))
            r = r[(r >= 0) & (r < t.rows)]
            if total + r.size > self.max_rows:   # the bound: the rest of this batch's rows are not looked ahead
                capped += total + r.size - self.max_rows
                r = r[:max(0, self.max_rows - total)]
            total += r.size
            merged[name] = r
        with self.cond:
            self.counts["rows_capped"] += capped
        return merged

    # ---------------------------------------------------------------- fed rows (no worker)
    def on_feed(self, index_values: List[np.ndarray]) -> None:
        """A step that feeds its ids is about to run: the pages of its rows are checked, then asked for at once
        (MADV_WILLNEED, all reads in flight together) instead of being faulted in one at a time inside the step.
        Nothing runs ahead of the step, so nothing is late or wasted."""
        rows = self._rows_of(index_values)
        prev, self.current = self.current, rows
        if prev and self._wants_find():
            self._find_timed(prev)
        b = _Batch(rows)
        with self.cond:
            self.counts["batches"] += 1
        checked = self._check(b)
        if self.mode == "on":
            c0 = time.thread_time()
            told = self._read_ahead(checked)
            b.pages = [(key, pg) for key, pg, _ in checked]
            # only the regions found in the pool are asked for: the others the step itself reads
            self._count_requested(b, told, {key for key, _, _ in checked})
            with self.cond:
                self.counts["worker_cpu_s"] += time.thread_time() - c0

    def add_skipped(self) -> None:
        """A fed step not looked at: the last steps' pages were in DRAM already (lookahead_feeds backs off)."""
        with self.cond:
            self.counts["skipped_steps"] += 1

    def add_before(self, seconds: float) -> None:
        """Wall time a step waited for its fed rows' lookahead before it ran (rows computed, checked, asked for)."""
        with self.cond:
            self.counts["before_s"] += seconds

    def clear(self) -> None:
        """The staged items were dropped (a reset): so are their rows."""
        with self.cond:
            self.items.clear()

    # ---------------------------------------------------------------- the step's side
    def on_take(self) -> None:
        """A step took its staged item and is about to run: check its pages, then let the worker go to the next."""
        with self.cond:
            if not self.items:
                return
            if self.mode == "on" and self.wait_s > 0:   # the worker takes items[0] only: this step's batch
                first = self.items[0]
                self.counts["wait_s"] += _timed_wait(self.cond, lambda: first.done or self._stop, self.wait_s)
            b = self.items.popleft()
            late = self.mode == "on" and not b.done and not b.skipped
            prev = self.current
            if not b.skipped:
                self.current = b.rows
            find = self._wants_find()
            if not find:
                self.cond.notify_all()
        if find and prev:
            self._find_timed(prev)
        if find:
            with self.cond:
                self.cond.notify_all()
        with self.cond:
            self.counts["batches"] += 1
            if late:
                self.counts["late_batches"] += 1
            if b.skipped:   # backing off: not looked at, not checked
                self.counts["skipped_steps"] += 1
                return
        self._check(b)

    def _check(self, b: _Batch) -> List:
        """Count the pages of the batch's rows resident now (and those resident after its touch but gone); the
        regions checked: ("table#region", page numbers, resident now)."""
        out = []
        if any(x is not None for v in self.bases.values() for x in v):
            checked = found = wasted = 0
            # this runs on the step's thread, just before it: the pages the worker computed for the batch are reused
            # (a batch's rows' pages are ~60k numbers at full scale: computing them here cost the step more than
            # its compute on 2 cores)
            for key, pg in (b.pages if b.pages is not None else self._found_pages(b.rows)):
                res = pages.resident(pg)
                out.append((key, pg, res))
                checked += pg.size
                n_in = int(res.sum())
                found += n_in
                after = b.after.get(key)
                if after is not None and n_in < pg.size:
                    wasted += int(np.isin(after, pg[~res], assume_unique=True).sum())
            with self.cond:
                self.counts["batches_measured"] += 1
                self.counts["pages_checked"] += checked
                self.counts["pages_resident"] += found
                self.counts["wasted_pages"] += wasted
        return out

    def _found_pages(self, rows: Dict[str, np.ndarray]):
        """("table#region", page numbers of the rows in it) for every region (variable 0, slots 1..) found in the
        pool."""
        for name, bases in list(self.bases.items()):
            r = rows.get(name)
            if r is None:
                continue
            t = self.plan.tables[name]
            # a slot laid out as its table (rows of the same bytes, at the same offset in a page) holds the same
            # rows on the same pages shifted: computed once per layout, not once per region
            done: Dict[tuple, tuple] = {}
            for i, base in enumerate(bases):
                if base is None:
                    continue
                rb = self._row_bytes(t, i)
                first = done.get((rb, base % pages.PAGE))
                if first is None:
                    pg = pages.row_pages(base, rb, r)
                    done[(rb, base % pages.PAGE)] = (base, pg)
                else:
                    pg = first[1] + (base - first[0]) // pages.PAGE
                yield f"{name}#{i}", pg

    def _row_bytes(self, t, i: int) -> int:
        """Row bytes of region i of a table: 0 the variable, 1.. its slots (a slot's dtype is an op attribute, read
        once: every batch asks for every region's)."""
        key = (id(t), i)
        rb = self._row_bytes_of.get(key)
        if rb is None:
            rb = self._row_bytes_of[key] = t.row_bytes if i == 0 else self._slot_row_bytes(t, i - 1)
        return rb

    @staticmethod
    def _slot_row_bytes(t, i: int) -> int:
        s = t.slots[i]
        return t.row_bytes // t.dtype.size * s.op.get_attr("dtype").size

    # ---------------------------------------------------------------- the worker
    def _next(self) -> Optional[_Batch]:
        with self.cond:
            while not self._stop and not (self.items and not self.items[0].started):
                self.cond.wait(0.5)
            if self._stop:
                return None
            b = self.items[0]        # the next step's batch: never further ahead
            b.started = True
            return b

    def _loop(self) -> None:
        while True:
            b = self._next()
            if b is None:
                return
            c0 = time.thread_time()
            try:
                read = self._work(b)
                if read is not None:
                    with self.cond:
                        self.back_off.read(read)
            except Exception as exc:  # the job goes on without the lookahead's help
                with self.cond:
                    self.counts["errors"] += 1
                    self.error = f"{type(exc).__name__}: {exc}"
            finally:
                with self.cond:
                    b.done = True
                    self.counts["worker_cpu_s"] += time.thread_time() - c0
                    self.cond.notify_all()

    def _work(self, b: _Batch) -> Optional[int]:
        """The batch's lookahead; the pages it read ahead for the tables found in the pool, or None where none is
        found (what the gathers of the others bring in is not known: no backing off on it)."""
        if self.mode != "on":
            # measure mode touches nothing; the pages of the batch's rows are computed here, off the step's thread
            b.pages = list(self._found_pages(b.rows))
            return None
        # tables found in the pool: their rows' pages not in DRAM are asked for at once (MADV_WILLNEED, all in flight
        # together); the others are read by a gather of their rows on the session (one page fault at a time)
        gather = {n: r for n, r in b.rows.items() if None in self.bases.get(n, [None])}
        regions = {n: [i for i, x in enumerate(self.bases.get(n, [None] * (1 + len(self.plan.tables[n].slots))))
                       if x is None] for n in gather}
        found = list(self._found_pages(b.rows))
        b.pages = found
        read0 = self.counts["pages_read_ahead"]
        told = self._read_ahead([(key, pg, pages.resident(pg)) for key, pg in found])
        read = self.counts["pages_read_ahead"] - read0
        if gather:
            self._run_touch(gather, False, regions)
        self._count_requested(b, told)
        for key, pg in found:
            b.after[key] = pg[pages.resident(pg)]
        return read if found else None

    def _read_ahead(self, checked) -> int:
        """checked: ("table#region", page numbers, resident now) of the found regions. Every page is told to the tier
        budget first (a step mark between the two keeps what comes in); only those not resident are asked for at once
        (MADV_WILLNEED, or the pager's fetch where tier_pager runs) and counted as read ahead. MADV_WILLNEED reads a
        range of the pool file whatever the process maps there: on a table's DRAM head (a private mapping of the file, tier_dram_head) it would fill the page cache
        with the file's own pages, which no one reads, and push out pool pages the steps need; a page in DRAM (a
        head's included) needs no read. The pages told, or -1 when the budget could not hear."""
        told = 0
        if checked:
            # both calls take the page numbers as uint64: converted once
            every = np.concatenate([pg for _, pg, _ in checked]).astype(np.uint64)
            told = pages.tell_budget(every)
            pages.tell_heat(every)   # the pager's heat: with every step told, its scans write-protect them seldom
        reads = [pg[~res] for _, pg, res in checked]
        # tier mode's own pager holds the tables as anonymous memory, which MADV_WILLNEED cannot bring back: it reads
        # them itself (the pages it filled are counted; others, of records it does not page, are left to the step)
        filled = pages.fetch(np.concatenate(reads)) if reads else 0
        if filled < 0:
            for pg in reads:
                pages.will_need(pg)
            filled = int(sum(r.size for r in reads))
        with self.cond:
            self.counts["pages_read_ahead"] += filled
        return told

    def _count_requested(self, b: _Batch, told: int, regions: Optional[set] = None) -> None:
        """Rows, pages and bytes of the batch requested ahead (of the "table#region" keys in `regions` only, when
        given), and the pages told to the budget."""
        known = {key: pg.size for key, pg in (b.pages or ())}   # the found regions' pages, computed already
        rows = pages_n = bytes_n = 0
        for name, r in b.rows.items():
            t = self.plan.tables[name]
            keys = [i for i in range(1 + len(t.slots)) if regions is None or f"{name}#{i}" in regions]
            if keys:
                rows += int(r.size)
            bases = self.bases.get(name) or []
            for i in keys:
                rb = self._row_bytes(t, i)
                n = known.get(f"{name}#{i}")
                if n is None:
                    # at the region's address when it was found (rows straddle pages there as they do in memory),
                    # else as if it began on a page
                    base = (bases[i] if i < len(bases) else None) or 0
                    n = pages.row_pages(base, rb, r).size
                pages_n += int(n)
                bytes_n += int(r.size * rb)
        with self.cond:
            self.counts["batches_touched"] += 1
            if told >= 0:
                self.counts["budget_pages_told"] += told
            else:
                self.counts["budget_batches_untold"] += 1
            self.counts["rows_requested"] += rows
            self.counts["pages_requested"] += pages_n
            self.counts["bytes_requested"] += bytes_n

    def _wants_find(self) -> bool:
        """Whether the pool is to be searched before this step: a table or slot not found yet, tries left."""
        if self.pool is None or not any(None in self.bases.get(n, [None]) for n in self.plan.tables):
            return False
        if self._pair_after_scans and pages.heat_scans() < self._pair_after_scans:
            return False
        retry = self._find_tries - FIND_TRIES
        return retry < 0 or (retry < FIND_RETRIES and self.counts["batches"] >= FIND_RETRY_FIRST << retry)

    def _find_timed(self, prev: Dict[str, np.ndarray]) -> None:
        """Search the pool for the tables by the rows the last step used: between two steps no table is written
        (a put and the worker only read), so those rows are in DRAM and hold still while the pool is searched."""
        c0 = time.perf_counter()
        try:
            self._find(prev)
        except Exception as exc:
            with self.cond:
                self.counts["errors"] += 1
                self.error = f"finding the tables: {type(exc).__name__}: {exc}"
        with self.cond:
            self.counts["find_s"] += time.perf_counter() - c0

    def _find(self, rows: Dict[str, np.ndarray]) -> None:
        """Look for the tables not found yet in the pool's resident pages, by the values of some of `rows`."""
        self._find_tries += 1
        names = [n for n in rows if None in self.bases.get(n, [None]) and rows[n].size][:FIND_PER_BATCH]
        # many rows: an optimizer slot's rows stay at its constant until steps move them past a float's rounding
        # (Adagrad's 0.1 plus squared gradients of ~1e-5), and only a moved row tells one slot from another
        pick = {n: np.unique(rows[n][np.linspace(0, rows[n].size - 1, num=min(FIND_ROWS, rows[n].size)).astype(int)])
                for n in names}
        values = self._run_touch(pick, True, None)
        wanted, sizes = {}, {}
        for name in names:
            t = self.plan.tables[name]
            for i, v in enumerate(values.get(name) or []):
                wanted[f"{name}#{i}"] = (self._row_bytes(t, i), pick[name], np.asarray(v))
                sizes[f"{name}#{i}"] = t.rows * self._row_bytes(t, i)
        # the allocator's list of the pool's records first (a table is one record of its size), then a search of
        # the resident pages by content for what it does not place
        records = pages.pool_records(min(sizes.values())) if sizes else None
        found = pages.find_in_records(records, wanted, sizes) if records else {}
        rest = {k: v for k, v in wanted.items() if k not in found}
        if rest and self._find_tries <= FIND_TRIES:   # a retry looks at the records only (the search reads GiBs)
            found.update(pages.find_bases(self.pool, rest))
        for name in names:
            old = self.bases.get(name, [None] * (1 + len(self.plan.tables[name].slots)))
            self.bases[name] = [x if x is not None else found.get(f"{name}#{i}") for i, x in enumerate(old)]
        if records:
            self._pair_slots(records)

    def _pair_slots(self, records) -> None:
        """The slots still unfound of tables found, paired with records of their size by the pages the steps wrote
        (where tier mode's pager runs: lookahead_pages.pair_by_writes)."""
        taken = {x for b in self.bases.values() for x in b if x is not None}
        want = {}
        for name, b in self.bases.items():
            t = self.plan.tables[name]
            for i in range(1, len(b)):
                # page for page: only a slot whose rows are the table's size lies at the same offsets
                if b[0] is not None and b[i] is None and self._row_bytes(t, i) == self._row_bytes(t, 0):
                    want[f"{name}#{i}"] = (b[0], t.rows * self._row_bytes(t, 0))
        unheard: set = set()
        paired = pages.pair_by_writes(want, records, taken, unheard) if want else {}
        for key, base in paired.items():
            name, i = key.rsplit("#", 1)
            self.bases[name][int(i)] = base
        if unheard and self._find_tries > FIND_TRIES and not any(b[0] is None for b in self.bases.values()):
            scans = pages.heat_scans()
            if scans >= 0:   # the slots wait for heat: this try did not count, the next once the pager scanned more
                self._find_tries -= 1
                self._pair_after_scans = scans + PAIR_AFTER_SCANS
        with self.cond:
            self.counts["regions_paired"] += len(paired)

    def stop(self, timeout_s: float = 1.0) -> None:
        with self.cond:
            self._stop = True
            self.cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def report(self) -> Dict:
        c = dict(self.counts)
        c["worker_cpu_s"] = round(c["worker_cpu_s"], 4)
        c["find_s"] = round(c["find_s"], 4)
        c["wait_s"] = round(c["wait_s"], 4)
        c["before_s"] = round(c["before_s"], 4)
        c["resident_share"] = (round(c["pages_resident"] / c["pages_checked"], 4) if c["pages_checked"] else None)
        c["tables_measured"] = sum(1 for b in self.bases.values() if b and b[0] is not None)
        c["regions_found"] = sum(1 for b in self.bases.values() for x in b if x is not None)
        # which were not (a variable "#0", its slots "#1".. in the order of its optimizer's update), the first 32
        c["regions_not_found"] = [f"{n}#{i}" for n in self.plan.tables
                                  for i, x in enumerate(self.bases.get(n) or [None] * (1 + len(self.plan.tables[n].slots)))
                                  if x is None][:32]
        c["regions"] = sum(1 + len(t.slots) for t in self.plan.tables.values())
        c["pool_found"] = self.pool is not None
        if self.error:
            c["error"] = self.error
        return c
