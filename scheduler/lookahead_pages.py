# lookahead_pages.py -- where a table's rows lie in the tier pool's mapping, and which of their pages are in DRAM (mincore).
"""The lookahead's measure: TF does not say where a variable's buffer is, so a table is found in the pool mapping by
its contents (a few rows' bytes, read from the session, searched in the pool's resident pages only: the search reads
no page from disk), and the pages of a batch's rows are then checked with mincore, which reads nothing either.
The pages read ahead are told to the tier's resident budget first (rtkit_tier_want of the preloaded allocator): to
its page heat they are unwritten, so cold, and its next step mark would drop them before their step ran. Where tier
mode's own pager holds the tables (tier_pager), the pages are anonymous memory, which MADV_WILLNEED cannot bring
back: the pager reads them from the pool and puts them in place itself (rtkit_tier_pager_fetch)."""
from __future__ import annotations

import collections
import ctypes
import mmap
import os
from typing import Dict, List, Optional, Tuple

import numpy as np

PAGE = mmap.PAGESIZE
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
MADV_WILLNEED = 3


def _preloaded(name: str, restype, argtypes):
    """A function of the preloaded allocator (the process's global namespace), or None when it is not there."""
    try:
        fn = getattr(_libc, name)
    except AttributeError:
        return None
    fn.restype, fn.argtypes = restype, argtypes
    return fn


_want = _preloaded("rtkit_tier_want", ctypes.c_long, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t])
_want_counts = _preloaded("rtkit_tier_want_counts", ctypes.c_int, [ctypes.c_void_p, ctypes.c_int])
_resident = _preloaded("rtkit_tier_resident", ctypes.c_long,
                       [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_void_p])
_fetch = _preloaded("rtkit_tier_pager_fetch", ctypes.c_long, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t])
_heat = _preloaded("rtkit_tier_pager_heat", ctypes.c_long, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t])
_likeness = _preloaded("rtkit_tier_pager_likeness", ctypes.c_long,
                       [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_void_p])
_scans = _preloaded("rtkit_tier_pager_scans", ctypes.c_long, [])
_records = _preloaded("rtkit_malloc_pool_records", ctypes.c_size_t, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint64])
MAX_HITS = 64
# pair_by_writes: a slot is taken for its table's when their pages' write histories agree this often, this much more
# often than the next candidate's, over this many pages at least
TWIN_SCORE = 0.9
TWIN_MARGIN = 0.2
TWIN_PAGES = 64
GAP_PAGES = 64                # resident(): pages this far apart are checked by separate mincore calls
CHUNK_BYTES = 64 << 20        # the search reads the resident pool this much at a time (memory held: a few times it)
FIND_MAX_BYTES = 4 << 30      # and this much at most: a table not found in it is gathered instead of measured


def pool_range(path: str) -> Optional[Tuple[int, int]]:
    """(start, end) of the largest mapping of the pool file at `path` in this process, or None."""
    if not path:
        return None
    want = os.path.realpath(path)
    best = None
    try:
        with open("/proc/self/maps") as fh:
            for line in fh:
                parts = line.split(None, 5)
                if len(parts) < 6 or not parts[5].strip().startswith(want):
                    continue
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                if best is None or hi - lo > best[1] - best[0]:
                    best = (lo, hi)
    except OSError:
        return None
    return best


def mincore(lo: int, hi: int) -> np.ndarray:
    """Residency (bool per page) of the pages of [lo, hi), lo page-aligned; all False when mincore fails."""
    n = (hi - lo + PAGE - 1) // PAGE
    vec = np.zeros(n, dtype=np.uint8)
    if n and _libc.mincore(ctypes.c_void_p(lo), ctypes.c_size_t(n * PAGE), vec.ctypes.data_as(ctypes.c_void_p)):
        vec[:] = 0
    return (vec & 1).astype(bool)


def distinct(values: np.ndarray) -> np.ndarray:
    """The distinct values, ascending: np.unique's result by a sort. NumPy 2.4's np.unique of integers hashes them
    first: 7-11x slower on a batch's ids (4k-100k of them), 1.7% of all CPU at the capacity bench's full scale."""
    s = np.sort(values)
    return s[np.concatenate(([True], s[1:] != s[:-1]))] if s.size else s


def row_pages(base: int, row_bytes: int, rows: np.ndarray) -> np.ndarray:
    """The distinct page numbers (address // PAGE) holding the given rows of a table at `base`."""
    if rows.size == 0:
        return rows.astype(np.int64)
    first = (base + rows * row_bytes) // PAGE
    last = (base + rows * row_bytes + row_bytes - 1) // PAGE
    if rows.size > 1 and not (rows[1:] > rows[:-1]).all():
        return distinct(np.concatenate([first, last]))
    # rows ascending and distinct (a batch's, as the lookahead makes them): a row's last page is never past the next
    # row's first, so first and last pages interleaved are in order and the distinct ones are where they change, with
    # no sort (the sort was a third of the lookahead worker's time on the capacity bench)
    both = np.column_stack((first, last)).ravel()
    return both[np.concatenate(([True], both[1:] != both[:-1]))]


def resident(pages: np.ndarray) -> np.ndarray:
    """Residency of each page number in `pages` (sorted, distinct): one mincore per cluster of pages less than
    GAP_PAGES apart, so scattered rows of a large table cost their own pages, not the table's span. The calls share
    one vector and go straight to libc: a step's few dozen scattered pages are checked before every step, and a
    vector and conversions per call cost more than the calls (0.6 ms a step on word2vec's 30 pages). The preloaded
    allocator's rtkit_tier_resident does the same in one call (~20 ms a batch in Python for the capacity bench's 100
    regions, about 1 in C)."""
    out = np.zeros(pages.size, dtype=bool)
    if pages.size == 0:
        return out
    if _resident is not None:
        a = np.ascontiguousarray(pages, dtype=np.uint64)
        vec = np.zeros(a.size, dtype=np.uint8)
        if _resident(a.ctypes.data, a.size, PAGE, vec.ctypes.data) >= 0:
            return vec.astype(bool)
    cuts = np.flatnonzero(np.diff(pages) >= GAP_PAGES) + 1
    starts = np.concatenate([[0], cuts])
    ends = np.concatenate([cuts, [pages.size]])
    los, his = pages[starts], pages[ends - 1] + 1
    vec = np.zeros(int((his - los).max()), dtype=np.uint8)
    at = vec.ctypes.data
    for a, b, lo, hi in zip(starts.tolist(), ends.tolist(), los.tolist(), his.tolist()):
        if a + 1 == b:   # a page alone: one byte of the vector
            out[a] = not _libc.mincore(lo * PAGE, PAGE, at) and bool(vec[0] & 1)
        elif not _libc.mincore(lo * PAGE, (hi - lo) * PAGE, at):   # a failed call leaves them not resident
            out[a:b] = (vec[pages[a:b] - lo] & 1).astype(bool)
    return out


def will_need(pages: np.ndarray) -> int:
    """madvise(MADV_WILLNEED) on the runs of consecutive pages in `pages` (sorted): the kernel starts reading them
    into the page cache at once, all runs in flight together, and nothing is written. Returns the calls made."""
    if pages.size == 0:
        return 0
    breaks = np.flatnonzero(np.diff(pages) != 1)
    starts = np.concatenate([[pages[0]], pages[breaks + 1]])
    ends = np.concatenate([pages[breaks], [pages[-1]]]) + 1
    for s, e in zip(starts.tolist(), ends.tolist()):
        _libc.madvise(ctypes.c_void_p(s * PAGE), ctypes.c_size_t((e - s) * PAGE), MADV_WILLNEED)
    return int(starts.size)


def fetch(pages: np.ndarray) -> int:
    """Have tier mode's pager read these pages (page numbers) from the pool into DRAM now, all runs' reads in flight
    together: the 4 KiB pages it filled (those it had evicted or not brought in yet), or -1 where the pager does not
    run (off, refused, the allocator not preloaded, before the first step mark, a forked child)."""
    if _fetch is None:
        return -1
    a = np.ascontiguousarray(pages, dtype=np.uint64)
    return int(_fetch(a.ctypes.data, a.size, PAGE)) if a.size else 0


def tell_heat(pages: np.ndarray) -> int:
    """Tell tier mode's pager that the next step uses these pages (page numbers, every page of its rows in the regions
    found): a region told at every step is write-protected at every eighth heat scan or further apart, while few
    writes there were not told, so the steps fault on their writes far less (rtkit_tier_pager_heat). The 4 KiB pages
    recorded, or -1 where the pager does not run."""
    if _heat is None:
        return -1
    a = np.ascontiguousarray(pages, dtype=np.uint64)
    return int(_heat(a.ctypes.data, a.size, PAGE))


def heat_scans() -> int:
    """The heat scans tier mode's pager has run so far, or -1 where it does not run (rtkit_tier_pager_scans)."""
    return int(_scans()) if _scans is not None else -1


def tell_budget(pages: np.ndarray) -> int:
    """Tell the tier's resident budget that the next step uses these pages (page numbers): its next mark drops them
    last. The 4 KiB pages recorded, or -1 when nothing is: the allocator not preloaded, tier mode or its heat budget
    off (tier_resident_max, tier_heat_every), before the first step mark, a forked child."""
    if _want is None:
        return -1
    a = np.ascontiguousarray(pages, dtype=np.uint64)
    return int(_want(a.ctypes.data, a.size, PAGE)) if a.size else 0


def budget_counts() -> Optional[Tuple[int, int, int]]:
    """The budget's counts of the pages told (the whole process's): (recorded, kept, dropped all the same), or None
    while it records nothing."""
    if _want_counts is None:
        return None
    out = (ctypes.c_uint64 * 3)()
    return tuple(int(x) for x in out) if _want_counts(out, 3) == 3 else None


def _resident_chunks(lo: int, hi: int):
    """The pool's resident pages as (address, bytes) pieces of at most CHUNK_BYTES, at most FIND_MAX_BYTES in all:
    the search holds one piece in memory at a time, never a copy of the whole resident pool."""
    idx = np.flatnonzero(mincore(lo, hi))
    if idx.size == 0:
        return
    breaks = np.flatnonzero(np.diff(idx) != 1)
    starts = np.concatenate([[idx[0]], idx[breaks + 1]])
    ends = np.concatenate([idx[breaks], [idx[-1]]]) + 1
    left = FIND_MAX_BYTES
    for s, e in zip(starts.tolist(), ends.tolist()):
        a, n = lo + s * PAGE, (e - s) * PAGE
        while n > 0 and left > 0:
            take = min(n, CHUNK_BYTES, left)
            yield a, take
            a, n, left = a + take, n - take, left - take


def pool_records(min_bytes: int, max_records: int = 4096) -> Optional[List[Tuple[int, int]]]:
    """(payload address, bytes) of the tier pool's live records of at least min_bytes, from the preloaded allocator
    (rtkit_malloc_pool_records); None when it is not loaded here."""
    if _records is None:
        return None
    out = np.zeros((max_records, 2), dtype=np.uint64)
    n = int(_records(out.ctypes.data_as(ctypes.c_void_p), max_records, int(min_bytes)))
    return [(int(a), int(b)) for a, b in out[:n]]


def find_in_records(records: List[Tuple[int, int]], wanted: Dict[str, Tuple[int, np.ndarray, np.ndarray]],
                    sizes: Dict[str, int]) -> Dict[str, int]:
    """name -> base of each table whose rows' values lie at their places in exactly one record of the table's size
    (sizes[name]), none taken by another name: a table's optimizer slot, a constant at first and then rows hardly
    moved from it, is told from the table by its rows, where a search by content finds no distinctive word. A
    name two records fit equally (two fresh slots of one shape) stays unfound."""
    fits: Dict[str, List[int]] = {}
    for name, (row_bytes, rows, values) in wanted.items():
        want = [(int(r), np.ascontiguousarray(v).tobytes()) for r, v in zip(rows.tolist(), values)]
        fits[name] = [a for a, n in records if n == sizes.get(name) and want and
                      all(ctypes.string_at(a + r * row_bytes, row_bytes) == b for r, b in want)]
    out: Dict[str, int] = {}
    for name, cands in fits.items():
        others = {a for m, c in fits.items() if m != name and len(c) == 1 for a in c}
        left = [a for a in cands if a not in others]
        if len(left) == 1:
            out[name] = left[0]
    return out


def pair_by_writes(tables: Dict[str, Tuple[int, int]], records: List[Tuple[int, int]], taken: set,
                   unheard: Optional[set] = None) -> Dict[str, int]:
    """name -> record for each slot of tables[name] = (its table's base, bytes) whose pages the steps wrote as they
    wrote the table's, page for page (tier_pager's heat: rtkit_tier_pager_likeness), among the records of that size
    not in `taken`. An Adagrad slot no step has moved off its 0.1 holds no row that tells it from another slot of its
    shape (find_in_records), but the optimizer writes its rows in the steps that write its table's: the same pages of
    both are written in the same heat scans, another table's at its own rows. A slot two candidates fit alike, or
    that TWIN_SCORE is not reached for, stays unfound; each record goes to the slot it fits best. The names whose
    candidates no heat scan has aged yet (fewer than TWIN_PAGES pages to compare: the pager's scans start a few
    scans before its limit) are added to `unheard`: asked again later, they may pair."""
    if _likeness is None:
        return {}
    scored = []
    for name, (table, nbytes) in tables.items():
        cands = [a for a, n in records if n == nbytes and a not in taken and a != table]
        if not cands:
            continue
        scores = (ctypes.c_double * len(cands))()
        most = _likeness(table, (ctypes.c_void_p * len(cands))(*cands), len(cands), nbytes, scores)
        if most < TWIN_PAGES:
            if unheard is not None:
                unheard.add(name)
            continue
        ranked = sorted(zip(scores, cands), reverse=True)
        best, second = ranked[0][0], ranked[1][0] if len(ranked) > 1 else -1.0
        if best >= TWIN_SCORE and best - second >= TWIN_MARGIN:
            scored.append((best, name, ranked[0][1]))
    out: Dict[str, int] = {}
    for _, name, a in sorted(scored, reverse=True):
        if a not in out.values():
            out[name] = a
    return out


def find_bases(pool: Tuple[int, int], wanted: Dict[str, Tuple[int, np.ndarray, np.ndarray]]) -> Dict[str, int]:
    """name -> base address of each table found: wanted[name] = (row bytes, rows, their values [len(rows), ...]).
    A row's bytes found at address a vote for base a - row * row_bytes (64-byte aligned, inside the pool); a base
    two rows agree on is taken. Only resident pages are read (FIND_MAX_BYTES of them at most, a piece at a time):
    their words are matched against the first word of every row at once (8-byte words for rows of a multiple of 8
    bytes, else 4-byte), a word found more than MAX_HITS times in a piece (a constant fill) is left out, and each
    match is checked against the whole row. A row that straddles two pieces is not seen: the other rows vote."""
    lo, hi = pool
    needles: Dict[int, List[Tuple[str, int, int, bytes]]] = {8: [], 4: []}   # word size -> (name, row, bytes, row's bytes)
    for name, (row_bytes, rows, values) in wanted.items():
        w = 8 if row_bytes % 8 == 0 else 4
        for r, v in zip(rows.tolist(), values):
            b = np.ascontiguousarray(v).tobytes()
            if len(b) == row_bytes and b.strip(b"\0"):   # an all-zero row says nothing
                needles[w].append((name, int(r), row_bytes, b))
    keyed: Dict[int, Tuple[Dict[int, List], np.ndarray, np.ndarray]] = {}
    for w, items in needles.items():
        if not items:
            continue
        dt = np.uint64 if w == 8 else np.uint32
        keys: Dict[int, List] = {}
        for it in items:
            keys.setdefault(int(np.frombuffer(it[3][:w], dtype=dt)[0]), []).append(it)
        karr = np.fromiter(keys, dtype=dt, count=len(keys))
        low = np.zeros(1 << 16, dtype=bool)   # a first pass on the low 16 bits: one table lookup per word
        low[(karr & 0xFFFF).astype(np.int64)] = True
        keyed[w] = (keys, karr, low)
    votes: Dict[str, "collections.Counter"] = collections.defaultdict(collections.Counter)
    for addr, n in (_resident_chunks(lo, hi) if keyed else ()):
        data = ctypes.string_at(addr, n)
        for w, (keys, karr, low) in keyed.items():
            words = np.frombuffer(data, dtype=karr.dtype)
            cand = np.flatnonzero(low[(words & 0xFFFF).astype(np.int64)])
            hits = cand[np.isin(words[cand], karr)]
            if hits.size:
                vals, counts = np.unique(words[hits], return_counts=True)
                common = vals[counts > MAX_HITS]
                if common.size:
                    hits = hits[~np.isin(words[hits], common)]
            for h in hits.tolist():
                p = h * w
                for name, r, row_bytes, b in keys[int(words[h])]:
                    if p + row_bytes <= n and data[p:p + row_bytes] == b:
                        base = addr + p - r * row_bytes
                        if base % 64 == 0 and lo <= base < hi:
                            votes[name][base] += 1
    out: Dict[str, int] = {}
    for name, c in votes.items():
        base, count = c.most_common(1)[0]
        if count >= 2:
            out[name] = base
    return out
