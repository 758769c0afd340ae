# tier_view.py -- the `tier` view of a report: what tier mode's pool held, what of it stayed in DRAM, what it cost on disk.
"""Read from the `pmem` section (pmem-<pid>.json, prmalloc/tier_stats.c) and the `process` section (the child's
/proc/PID/io at exit). Kept apart from sections.py and terminal.py's wording: they call three functions.

- tier_view(report): {"off", "rows", "tables", "notes"} for sections.py's `tier` Section (rows + the largest
  pooled records with resident bytes and hot fraction; notes: the summary's tier warnings)
- cost_words(report): what the pool cost (resident bytes, major faults/step, disk writes) for the summary's tier line
- series(report): (t_s, resident bytes) and (t_s, major faults per second) for the HTML plots

"Hot fraction" of a record is the share of its pages resident in DRAM at the last sample (mincore): with
a resident budget or under memory pressure the kernel keeps what the steps touch, so this is the share of
the record that training uses; without pressure every touched page stays and it is an upper bound."""
from __future__ import annotations

import statistics
from typing import Any, Dict, List, Optional, Tuple

from rtkit.report import fmt
from rtkit.report.contract import Pmem as PM, Process as P
from rtkit.report.fmt import get


def _pmem(report: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    p = report.get("pmem")
    return p if isinstance(p, dict) and p.get(PM.STATE) not in (None, "off") else None


WARMUP_STEPS = 3   # rtkit's default warm-up: the first steps still fault in what initialisation left


def _training_samples(p: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Timeline samples taken while the job trained past its warm-up (the job's own teardown frees the
    pool at exit; the first steps still carry initialisation's faults)."""
    tl = [x for x in (get(p, PM.TIMELINE) or []) if isinstance(x, dict)]
    held = get(p, "tier_last_step_bytes") or 0
    during = [x for x in tl if (x.get("tier_bytes") or 0) >= held / 2] or tl
    return [x for x in during if (x.get("step") or 0) > WARMUP_STEPS] or during


def faults_per_step(p: Dict[str, Any]) -> Optional[float]:
    tl = [x for x in _training_samples(p) if (x.get("step") or 0) >= 1]
    if len(tl) < 2 or tl[-1]["step"] <= tl[0]["step"]:
        return None
    return (tl[-1]["major_faults"] - tl[0]["major_faults"]) / (tl[-1]["step"] - tl[0]["step"])


def resident_while_training(p: Dict[str, Any]) -> Optional[int]:
    tl = _training_samples(p)
    return max((x.get("resident_bytes") or 0 for x in tl), default=None) if tl else None


# A resident budget's passes write pages out and drop them on a worker beside the steps, so the pool's pages in DRAM
# swing above the budget between passes; a median this many times the budget means the passes never caught up.
BUDGET_BEHIND_X = 1.5
BUDGET_BEHIND_SAMPLES = 2


def resident_against_budget(p: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """{budget, median, samples}: the median (the lower middle one of an even count) of the pool's pages in DRAM over
    the samples taken while training past the warm-up, beside tier_resident_max; None without a budget or a step."""
    budget = get(p, PM.RESIDENT_MAX)
    if not budget or p.get("step_marks") == 0:
        return None
    tl = [x.get("resident_bytes") or 0 for x in _training_samples(p)]
    if not tl:
        return None
    return {"budget": budget, "median": statistics.median_low(tl), "samples": len(tl)}


def cost_words(report: Dict[str, Any]) -> List[str]:
    """What the pool cost while training, for the summary's tier line: resident pool bytes (max after the
    warm-up), major faults per step (mean over the sampled steps), bytes the child wrote to disk."""
    p = _pmem(report)
    if p is None or p.get(PM.STATE) != "on":
        return []
    out = []
    res = resident_while_training(p) if p.get("step_marks") != 0 else None   # no step: no warm-up to be after
    if res is not None:
        words = f"pool resident after warm-up (max) {fmt.nbytes(res)}"
        vs = resident_against_budget(p)
        if vs is not None:
            words += f", median {fmt.nbytes(vs['median'])}, budget (tier_resident_max) {fmt.nbytes(vs['budget'])}"
        out.append(words)
    paged = pager_words(p)
    head = get(p, "dram_head.bytes")
    if paged:
        out.append(paged)
    elif head:   # every pooled allocation of 1 MiB or more gets a head: rtkit cannot tell a table from other memory
        n = get(p, "dram_head.records")
        what = f"{fmt.num(n)} pooled allocation{'' if n == 1 else 's'}" if fmt.is_num(n) else "pooled allocations"
        out.append(f"heads in anonymous DRAM {fmt.nbytes(head)} ({what} of 1 MiB or more: tables or other "
                   "long-lived memory)")
    fps = faults_per_step(p)
    if fps is not None:
        out.append(f"major faults/step (mean) {fmt.num(round(fps, 1))}")
    written = get(report, "process." + P.DISK_WRITTEN_BYTES)
    if fmt.is_num(written):
        out.append(f"written to disk {fmt.nbytes(written)}" + _own_files_words(report, written))
    return out


def _own_files_words(report: Dict[str, Any], written: float) -> str:
    """The share of the child's disk writes that were rtkit's own run files (rewritten as the job runs), which the
    pool did not write: without it a short run's few MiB of pool writes read as tens of MiB."""
    own = get(report, "process." + P.RUN_FILES_WRITTEN_BYTES)
    if not fmt.is_num(own) or own <= 0:
        return ""
    return f" (of it rtkit's own run files {fmt.nbytes(min(own, written))})"


# The pool's pages in DRAM past the bytes live in it, at the highest RSS sampled, that count as tier mode raising
# peak RSS: at least this much, and this share of that RSS (a few MiB of headers and shared pages are no finding).
RAISED_MIN_BYTES = 16 << 20
RAISED_MIN_SHARE = 0.03


def rss_peak_sample(p: Any) -> Optional[Dict[str, Any]]:
    """The tier's highest RSS sample (pmem at_rss_peak) when it has its three figures (RSS, the pool's pages in DRAM,
    the bytes live in the pool), else None."""
    at = p.get(PM.AT_RSS_PEAK) if isinstance(p, dict) else None
    if not isinstance(at, dict) or not all(fmt.is_num(at.get(k)) for k in ("rss_bytes", "pool_dram_bytes", "tier_bytes")):
        return None
    return at


def raised_rss(p: Dict[str, Any]) -> Optional[Dict[str, int]]:
    """{rss, pool_dram, live, over, step} at the tier's highest RSS sample when the pool then held in DRAM more
    than what lived in it by RAISED_MIN_BYTES and RAISED_MIN_SHARE of that RSS, else None. The live bytes are about
    what the same allocations take in anonymous memory (less the allocator's own overhead), so most of `over` is
    DRAM that a run without tier mode would not hold."""
    at = rss_peak_sample(p)
    if at is None:
        return None
    rss, dram, live = at["rss_bytes"], at["pool_dram_bytes"], at["tier_bytes"]
    over = dram - live
    if over < RAISED_MIN_BYTES or over < RAISED_MIN_SHARE * rss:
        return None
    return {"rss": rss, "pool_dram": dram, "live": live, "over": over, "step": at.get("step")}


def _raised_words(report: Dict[str, Any], p: Dict[str, Any]) -> Optional[str]:
    r = raised_rss(p)
    if r is None:
        return None
    peak = get(report, "process." + P.PEAK_RSS_BYTES)
    when = "before the first step" if r["step"] == 0 else f"at step mark {fmt.num(r['step'])}"
    return (f"warning: tier mode raised peak RSS: at its highest RSS sample ({fmt.nbytes(r['rss'])} {when}"
            + (f"; the run's peak RSS {fmt.nbytes(peak)}" if fmt.is_num(peak) else "")
            + f") the pool held {fmt.nbytes(r['pool_dram'])} in DRAM for {fmt.nbytes(r['live'])} live in it "
            f"({fmt.nbytes(r['over'])} more); raise tier_min_size "
            f"(now {fmt.nbytes(p.get(PM.MIN_SIZE))}) or run without tier_pool_path")


# The steps write the whole tables: page heat saw at least this share of the bytes held in the pool written between
# two of its samples, on average, and the pool held at least WHOLE_WRITES_MIN_BYTES (a few small records are no finding).
WHOLE_WRITES_SHARE = 0.5
WHOLE_WRITES_MIN_BYTES = 16 << 20
PAGE = 4096


def written_per_sample(p: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """{written, held, every, budget} when page heat measured that the steps write about the whole pool between two
    of its samples (WHOLE_WRITES_SHARE of the bytes held at the last step, on average over the samples), else None.
    A step that updates only the rows it looks up writes their pages; one that writes this much updates every row
    (an optimizer whose update is dense: Keras's and TF's Adam decay every row's moments each step)."""
    samples, pages = get(p, PM.HEAT_SAMPLES), get(p, PM.HEAT_PAGES_WRITTEN)
    held = get(p, "tier_last_step_bytes")
    if get(p, PM.HEAT_MECHANISM) != "pagemap_scan" or not fmt.is_num(samples) or samples < 2 or not fmt.is_num(pages) \
            or not fmt.is_num(held) or held < WHOLE_WRITES_MIN_BYTES:
        return None
    written = int(pages * PAGE / samples)
    if written < WHOLE_WRITES_SHARE * held:
        return None
    return {"written": written, "held": int(held), "every": get(p, PM.HEAT_EVERY), "budget": get(p, PM.RESIDENT_MAX)}


# The pool lost its tables in the steps: the bytes live in it at the first step mark, at least this much, fell to half or
# less at every later sample while training.
LEFT_MIN_BYTES = 16 << 20


def held_floor(p: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """{first, first_step, floor, floor_step}: the bytes live in the pool at the first timeline sample (the first step
    mark) and the least at a later sample while training (the last sample, written at exit after the job freed its
    tables, left out); None with fewer than three samples."""
    tl = [x for x in (get(p, PM.TIMELINE) or []) if isinstance(x, dict) and fmt.is_num(x.get("tier_bytes"))
          and fmt.is_num(x.get("step"))]
    if len(tl) < 3 or tl[0]["step"] < 1:
        return None
    low = min(tl[1:-1], key=lambda x: x["tier_bytes"])
    return {"first": int(tl[0]["tier_bytes"]), "first_step": tl[0]["step"], "floor": int(low["tier_bytes"]),
            "floor_step": low["step"]}


def left_pool(p: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """held_floor when what the pool held at the first step mark (LEFT_MIN_BYTES or more) fell to half or less at every
    later sample while training: the buffers placed before the first step (tables, optimizer slots) were freed in the
    steps and their replacements made inside steps, in DRAM (measured with tf_keras's Embedding tables and Adam slots;
    not traced, most likely TensorFlow's copy of a variable's buffer on an update while another reference holds it);
    else None."""
    h = held_floor(p)
    if h is None or h["first"] < LEFT_MIN_BYTES or h["floor"] > h["first"] / 2:
        return None
    return h


def _left_words(p: Dict[str, Any]) -> Optional[str]:
    h = left_pool(p)
    if h is None:
        return None
    return (f"warning: what the pool held at the first step left it in the steps after: {fmt.nbytes(h['first'])} at "
            f"step mark {fmt.num(h['first_step'])}, {fmt.nbytes(h['floor'])} at step mark {fmt.num(h['floor_step'])} "
            "(the buffers placed before the first step, tables and optimizer slots, were replaced in the steps, and "
            "the new ones were made inside steps, in DRAM): tier mode keeps little of them out of anonymous memory; "
            "seen with Keras 2 (tf_keras) fits, whose Embedding tables and Adam slots leave the pool; a Keras 3 fit's stayed")


def _whole_writes_words(p: Dict[str, Any]) -> Optional[str]:
    w = written_per_sample(p)
    if w is None:
        return None
    every = f" (one every {fmt.num(w['every'])} steps)" if fmt.is_num(w["every"]) else ""
    budget = w["budget"] if fmt.is_num(w["budget"]) and w["budget"] else None
    cost = (f"the resident budget (tier_resident_max {fmt.nbytes(budget)}) then writes the tables out and reads them "
            "back every few steps" if budget is not None and budget < w["written"] else
            "every page of them is dirtied again and again, which a pool on disk writes back")
    return (f"warning: the steps write the whole tables, not only the rows they look up: page heat saw "
            f"{fmt.nbytes(w['written'])} of the pool's {fmt.nbytes(w['held'])} written per sample{every}, on average "
            f"(as an optimizer that updates every row each step does: Keras's and TF's Adam decay every row's moments); "
            f"{cost}; use an optimizer that updates only the rows looked up (SGD without momentum, tf_keras's "
            f"Adagrad)" + (f", a tier_resident_max of {fmt.nbytes(w['written'])} or more" if budget is not None and
                           budget < w["written"] else "") + " or run without tier_pool_path")


LATE_MIN_BYTES = 1 << 20   # less than this made after the first step and kept in DRAM is not worth a line


def _late_words(p: Dict[str, Any]) -> Optional[str]:
    """Requests of tier_min_size or more made after the first step mark that the placement rule left in DRAM and that
    lived on (tier_stats.c's dram_after_first_step: the most at one stats write), or None."""
    d = p.get("dram_after_first_step")
    if not isinstance(d, dict) or not fmt.is_num(d.get("peak_bytes")) or d["peak_bytes"] < LATE_MIN_BYTES:
        return None
    n = d.get("peak_allocs")
    return (f"warning: {fmt.num(n)} allocation{'' if n == 1 else 's'} ({fmt.nbytes(d['peak_bytes'])}) made after the "
            "first step "
            f"stayed in DRAM, live {fmt.num(d.get('live_marks_min'))} step marks or more after they were made (most at "
            f"once, at step mark {fmt.num(d.get('peak_at_mark'))}): tier mode places what exists before the first step "
            "and, after it, only sizes its profile saw outlive steps; models built or first trained after the first "
            "step (a second model's variables and optimizer slots) are not placed: build every model, and its "
            "optimizer's slots, before the first training step to have them placed; nor is what grows while "
            "training (a hash table of ids, such as a MutableHashTable, moves to larger buckets as it fills)")


def warning_words(report: Dict[str, Any]) -> List[str]:
    """What tier mode cost without saving, for the summary: requests the pool had no room for (no_room_words), the
    pool held more in DRAM than lived in it at the highest RSS sampled (raised_rss), the tables left the pool in the
    first steps (left_pool), the steps write the whole tables (written_per_sample), the pager's room is below what
    the steps touch (_room_short_words), no step mark ever reached it (so only placement before a first step ran),
    the pool's pages in DRAM stayed well above the resident budget, and where placement before the first step
    stopped because the pool churned."""
    p = _pmem(report)
    if p is None or p.get(PM.STATE) != "on" or p.get("step_marks") is None:
        return []
    pre = p.get("placed_before_first_step") or {}
    out = [w for w in (_no_room_words(p), _raised_words(report, p), _left_words(p), _whole_writes_words(p),
                       _late_words(p), _pager_off_words(p), _room_short_words(p)) if w]
    if p.get("step_marks") == 0:
        out.append("warning: no training step reached tier mode, so only its placement before a first step ran "
                   f"({fmt.nbytes(pre.get('bytes'))} placed, {fmt.nbytes(pre.get('freed_bytes'))} freed again); "
                   "mark steps (see `steps:`) or run without tier_pool_path")
    behind = _budget_behind_words(p)
    if behind:
        out.append(behind)
    if pre.get("stopped_for_churn"):
        line = ("placement before the first step stopped once most of what it placed was freed again "
                "(short-lived, not tables); later requests stayed in DRAM")
        if pre.get("still_placed_min_bytes"):   # table-sized requests are placed all the same
            line += f", but for those of {fmt.nbytes(pre['still_placed_min_bytes'])} or more (tables)"
        out.append(line)
    return out


NO_ROOM_MIN_BYTES = 1 << 20   # a pooled allocation this large is a table or other long-lived memory
NO_ROOM_ROUND = 256 << 20


def pool_size_with_room(p: Dict[str, Any]) -> Optional[int]:
    """The tier_pool_size that gives room to what fell back to DRAM, when requests of NO_ROOM_MIN_BYTES or more
    (a table the user sized the pool for may be among them) found none; else None. The pool's own size grown by
    every byte that fell back (one run of that much beside what it held, however the freed room lies), rounded up."""
    largest, fell = get(p, "tier_fallback_largest"), get(p, "tier_fallback_bytes")
    size, held = get(p, PM.POOL_SIZE), get(p, "tier_fallback_largest_held")
    if not all(fmt.is_num(x) for x in (largest, fell, size, held)) or largest < NO_ROOM_MIN_BYTES:
        return None
    return -(-(size + fell) // NO_ROOM_ROUND) * NO_ROOM_ROUND


def no_room_words(p: Dict[str, Any]) -> Optional[str]:
    """What found no room in the pool (the warning's body, without its tier_pool_size), or None."""
    if pool_size_with_room(p) is None:
        return None
    n, largest, held = get(p, "tier_fallbacks"), get(p, "tier_fallback_largest"), get(p, "tier_fallback_largest_held")
    before = (", before the first step: TensorFlow's initialisation holds a table's temporaries beside the table, "
              "and what it frees leaves the room in pieces")
    return (f"{fmt.num(n)} request{'s' if n != 1 else ''} found no room in the pool and stayed in DRAM "
            f"({fmt.nbytes(get(p, 'tier_fallback_bytes'))}; the largest {fmt.nbytes(largest)}, when the pool held "
            f"{fmt.nbytes(held)} of its {fmt.nbytes(get(p, PM.POOL_SIZE))}"
            + (before if get(p, "tier_fallback_largest_before_first_step") else "") + ")")


def _no_room_words(p: Dict[str, Any]) -> Optional[str]:
    """The warning when requests of a table's size found no room in the pool, with the pool size that has it."""
    what, enough = no_room_words(p), pool_size_with_room(p)
    if what is None:
        return None
    return f"warning: {what}; tier_pool_size={enough >> 20}M ({fmt.nbytes(enough)}) or more gives them room"


def _budget_behind_words(p: Dict[str, Any]) -> Optional[str]:
    """A warning when the pool's pages in DRAM stayed well above tier_resident_max while training: the budget is a
    goal its passes work toward, and a reader of "budget 256 MiB" would otherwise take it for a limit."""
    vs = resident_against_budget(p)
    if vs is None or vs["samples"] < BUDGET_BEHIND_SAMPLES or vs["median"] <= BUDGET_BEHIND_X * vs["budget"]:
        return None
    if get(p, PM.HEAT_MECHANISM) == "pagemap_scan":
        passes = (f"its heat passes ({fmt.num(get(p, PM.HEAT_SAMPLES))} in {fmt.seconds(get(p, PM.HEAT_SECONDS))}"
                  + (", on a worker beside the steps)" if get(p, "heat.on_worker") else ")"))
    else:
        passes = f"its round-robin passes ({fmt.num(get(p, 'budget_passes'))}, at most one a second)"
    return (f"warning: the pool's pages in DRAM stayed above tier_resident_max ({fmt.nbytes(vs['budget'])}): median "
            f"{fmt.nbytes(vs['median'])} over {vs['samples']} samples while training, "
            f"{vs['median'] / vs['budget']:.1f}x; {passes} write pages out and drop them more slowly than the steps "
            "bring them back: the budget is a goal, not a limit")


def _where(p) -> str:
    """Where the heat passes ran: beside the steps on the allocator's worker (the marks' own time then), or in the
    step marks (reports of builds before the worker say nothing)."""
    if get(p, "heat.on_worker") is None:
        return ""
    if not get(p, "heat.on_worker"):
        return " in the step marks"
    return f" beside the steps (the marks: {fmt.seconds(get(p, 'heat.mark_seconds'))})"


def _scans_from(pg: dict) -> str:
    """When the heat scans began (tier_pager_heat_lead scans before the limit at the process's growth, or at the
    latest at tier_pager_heat_from's share of its room), or why none ran, and how many of the regions they scanned
    they write-protected where the lookahead told the pages of the others (rtkit_tier_pager_heat); '' from a pager
    that does not say (older builds)."""
    if "first_scan_step" not in pg:
        return ""
    if not pg.get("scans"):
        return (f"(none: the process stayed under {fmt.nbytes(pg.get('heat_from_bytes'))} of anonymous memory, "
                "where tier_pager_heat_from starts them, and never came within tier_pager_heat_lead scans of its "
                "limit) ")
    near = (f" as its growth of {fmt.nbytes(pg.get('growth_bytes_per_step'))} a step neared the limit"
            if pg.get("first_scan_by_lead") else "")
    armed, scanned, told = pg.get("regions_armed"), pg.get("regions_scanned"), pg.get("told_pages")
    if not told or not scanned:
        spared = ""
    elif armed == scanned:   # told, but never every step of a window at few untold writes: no scan spared
        spared = (f"; all {fmt.num(scanned)} region scans write-protected, though the lookahead told "
                  f"{fmt.num(told)} pages")
    else:
        spared = (f"; {fmt.num(armed)} of {fmt.num(scanned)} region scans write-protected, the lookahead told the "
                  "others' pages")
    return f"(from step {fmt.num(pg.get('first_scan_step'))}{near}{spared}) "


def _wall_cpu(pg: dict, what: str) -> str:
    """`what`'s wall time on the pager's threads, and the CPU it took where the library says (a wait for a disk read or
    for a core shared with the job's own threads is wall time, not CPU)."""
    wall, cpu = pg.get(f"{what}_seconds"), pg.get(f"{what}_cpu_seconds")
    return fmt.seconds(wall) + (f" ({fmt.seconds(cpu)} of CPU)" if fmt.is_num(cpu) else "")


def pager_words(p: Dict[str, Any]) -> str:
    """What tier mode's own pager (tier_pager) did: the records it paged, its limit, what it evicted and wrote, what
    it read back; "" where it did not run."""
    pg = p.get("pager") or {}
    if not pg.get("on"):
        return ""
    n = pg.get("regions")
    data = pg.get("data_at_adopt_bytes")
    # what the job wrote before the first step (a table's initial values) is the file's: read in at its first touch,
    # not brought back, so the reads are not all evictions undone
    first = (f" ({fmt.nbytes(data)} of it written before the first step, read in from the pool at its first touch)"
             if fmt.is_num(data) and data >= 1 << 20 else "")
    words = (f"paged by rtkit (tier_pager): {fmt.nbytes(pg.get('adopted_bytes'))} in {fmt.num(n)} pooled "
             f"allocation{'' if n == 1 else 's'} of 1 MiB or more{first}, its limit on anonymous memory "
             f"{fmt.nbytes(pg.get('limit_bytes'))} (peak {fmt.nbytes(pg.get('anon_peak_bytes'))}: evictions start "
             f"near the limit and cannot take what the steps hold at once); {fmt.num(pg.get('evicted_pages'))} pages "
             "evicted by write heat "
             f"({fmt.nbytes(pg.get('evicted_bytes'))} written to the pool"
             + (f", {fmt.num(pg.get('evicted_same'))} kept as a repeated word (not written)" if pg.get("evicted_same")
                else "")
             + f"), {fmt.num(pg.get('filled_from_file'))} read from the pool at a fault"
             + (f", {fmt.num(pg.get('filled_same'))} rebuilt from their word at a fault" if pg.get("filled_same")
                else ""))
    if pg.get("fetch_filled"):
        words += (f" and {fmt.num(pg.get('fetch_filled'))} read ahead of their step (the lookahead"
                  + (f"; {fmt.num(pg.get('fetch_same'))} of them rebuilt from their word" if pg.get("fetch_same")
                     else "") + ")")
    errors = sum(pg.get(k) or 0 for k in ("read_errors", "write_errors", "move_errors", "scan_errors", "adopt_errors"))
    if errors:
        words += f"; {fmt.num(errors)} errors (read {fmt.num(pg.get('read_errors'))}: pages that read as zeros)"
    return words


ROOM_SHORT_MIN_EVICTIONS = 4   # fewer evicting steps than this say nothing steady about the room
ROOM_ROUND = 64 << 20
ROOM_MARGIN = 64 << 20         # tier_pager.c's SLACK_HI, the margin under the limit where evictions start, at a room
                               # of 512 MiB or more (an eighth of a smaller one): what the suggested room has


def room_that_holds(pg: Dict[str, Any]) -> Optional[int]:
    """The tier_pager_max at least, where the pager's room fell short of what the steps touch: the most anonymous
    memory the process held over its start (a step's temporaries count against the room too: rtkit's allocator keeps
    them for the next step), plus the pages that came back a step (evicted, so not in that peak), plus the margin
    under the limit where evictions start, rounded up. A floor where evictions kept the peak down: a TF2 loop (a
    1M x 64 table, Keras 3 Adagrad) given 64 MiB ran 739 ms a step and was told 832 MiB; at 832 MiB it ran 121 ms,
    11 MiB a step still back, and was told 960 MiB; at 1 GiB nothing was evicted, 93 ms."""
    back, evictions, room, limit, peak = (pg.get(k) for k in ("back_within_two_steps", "evictions", "room_bytes",
                                                               "limit_bytes", "anon_peak_bytes"))
    if not all(fmt.is_num(x) for x in (back, evictions, room, limit, peak)) or not evictions:
        return None
    over_start = max(peak - (limit - room), room)
    need = over_start + back * PAGE // evictions + ROOM_MARGIN
    return -(-need // ROOM_ROUND) * ROOM_ROUND


def _room_short_words(p: Dict[str, Any]) -> Optional[str]:
    """The warning when the pager's room is below what the steps touch: half or more of the pages it evicted were
    back in DRAM within two steps (tier_pager.c's back_within_two_steps: each at a fault or a read ahead), with the
    room that holds at least them (room_that_holds), or None."""
    pg = p.get("pager") or {}
    back, evicted, evictions = (pg.get(k) for k in ("back_within_two_steps", "evicted_pages", "evictions"))
    holds = room_that_holds(pg)
    if (not all(fmt.is_num(x) for x in (back, evicted, evictions)) or evictions < ROOM_SHORT_MIN_EVICTIONS
            or back * 2 < evicted or holds is None):
        return None
    fix = (f"set tier_pager_max to {fmt.nbytes(holds)} or more (the most the process held over its "
           "start, what came back a step and the margin where evictions start)" if pg.get("room_by_max") else
           "the DRAM left for it (MemAvailable less tier_pager_reserve) holds no more: give the job more memory or "
           "a smaller tier_pager_reserve")
    return (f"warning: the pager's room ({fmt.nbytes(pg['room_bytes'])}) is below what the steps touch: "
            f"{fmt.num(back)} of the {fmt.num(evicted)} pages it evicted ({100 * back / evicted:.0f}%) were back "
            f"within two steps, about {fmt.nbytes(back * PAGE // evictions)} a step that evicted, each brought back "
            "at a fault or ahead of its step (a table or optimizer slot that every step reads or writes whole needs "
            "room for all of it, as Keras 3's Adagrad reads its accumulator and a dense update writes it, and the "
            f"step's temporaries take the same room); {fix}")


def _pager_off_words(p: Dict[str, Any]) -> str:
    """tier_pager asked for but not running: its note says why (the heads ran instead)."""
    pg = p.get("pager") or {}
    return f"warning: {pg['note']}" if pg.get("setting") and not pg.get("on") and pg.get("note") else ""


def _head_written(written: Any) -> str:
    """The most of the heads the steps had written at a stats write: the process's own copies, in anonymous DRAM
    (the rest of a head is the pool file's page cache, which the kernel may reclaim)."""
    if not isinstance(written, int) or written < 0:
        return "which of their pages the steps wrote is not known (the kernel has no PAGEMAP_SCAN)"
    return f"up to {fmt.nbytes(written)} of them written by the steps (anonymous DRAM, never written back)"


def _by_heat(p: Dict[str, Any]) -> str:
    """The chunks the heat passes promoted into the heads' budget (none said where nothing was promoted)."""
    promoted = get(p, "dram_head.by_heat.bytes")
    if not promoted:
        return ""
    refused = get(p, "dram_head.by_heat.runs_refused")
    return (f"plus {fmt.nbytes(promoted)} of the hottest chunks chosen by page heat"
            + (f" ({fmt.num(refused)} runs refused at the mapping limit)" if refused else "") + "; ")


def tier_view(report: Dict[str, Any]) -> Dict[str, Any]:
    """off: why there is nothing to show (or None); rows: (name, text); tables: (title, headers, rows); notes: the
    summary's tier warnings (warning_words)."""
    view: Dict[str, Any] = {"off": None, "rows": [], "tables": [], "notes": warning_words(report)}
    p = _pmem(report)
    if p is None or p.get(PM.STATE) != "on":
        view["off"] = "tier mode off" if p is None else f"tier mode {p.get(PM.STATE)}"
        return view
    rows = view["rows"]
    rows.append(("pool", f"{p.get(PM.PATH)} ({p.get(PM.MEDIUM)}), {fmt.nbytes(p.get(PM.POOL_SIZE))}"))
    rows.append(("bytes in the pool (last step)", fmt.nbytes(get(p, "tier_last_step_bytes"))))
    res = resident_while_training(p) if p.get("step_marks") != 0 else None   # no step: no warm-up to be after
    if res is not None:
        rows.append(("pool file pages in DRAM while training (max after warm-up)", fmt.nbytes(res)))
    at = p.get(PM.AT_RSS_PEAK)
    if isinstance(at, dict) and at.get("rss_bytes"):
        rows.append(("at the highest RSS sampled", f"RSS {fmt.nbytes(at.get('rss_bytes'))}, pool pages in DRAM "
                     f"{fmt.nbytes(at.get('pool_dram_bytes'))}, bytes live in the pool {fmt.nbytes(at.get('tier_bytes'))}"))
    paged = pager_words(p)
    if paged:
        pg = p["pager"]
        rows.append(("pager (tier_pager)", paged[0].upper() + paged[1:] + f"; {fmt.num(pg.get('scans'))} heat scans "
                     f"{_scans_from(pg)}in {_wall_cpu(pg, 'scan')}, evictions {_wall_cpu(pg, 'evict')}, faults served in "
                     f"{_wall_cpu(pg, 'fill')} (on the pager's threads)"))
    elif get(p, "dram_head.setting_bytes"):
        rows.append(("heads in DRAM (tier_dram_head)",
                     f"{fmt.nbytes(get(p, 'dram_head.bytes'))} of a {fmt.nbytes(get(p, 'dram_head.budget_bytes'))} "
                     f"budget, {fmt.num(get(p, 'dram_head.records'))} "
                     f"record{'' if get(p, 'dram_head.records') == 1 else 's'} of 1 MiB or more (tables or other "
                     "long-lived memory), made in "
                     f"{fmt.num(round(get(p, 'dram_head.seconds') or 0, 2))} s at the first step; "
                     f"{_by_heat(p)}{_head_written(get(p, 'dram_head.written_peak_bytes'))}"))
    budget = get(p, PM.RESIDENT_MAX)
    if budget:
        rows.append(("resident budget (tier_resident_max)",
                     f"{fmt.nbytes(budget)}, {fmt.num(get(p, 'budget_passes'))} passes dropped "
                     f"{fmt.nbytes(get(p, 'budget_dropped_bytes'))}"))
        mech = get(p, PM.HEAT_MECHANISM)
        if mech == "pagemap_scan":
            rows.append(("page heat (tier_heat_every)",
                         f"every {fmt.num(get(p, 'heat.every_steps'))} steps, {fmt.num(get(p, PM.HEAT_SAMPLES))} samples "
                         f"in {fmt.seconds(get(p, PM.HEAT_SECONDS))}{_where(p)}; {fmt.num(get(p, PM.HEAT_DEMOTED))} cold 64 KiB "
                         f"chunks demoted ({fmt.nbytes(get(p, PM.HEAT_DEMOTED_BYTES))} dropped, "
                         f"{fmt.nbytes(get(p, PM.HEAT_WRITTEN_OUT_BYTES))} of it written since its last write-out), "
                         f"{fmt.num(get(p, PM.HEAT_PROMOTED))} promoted (written again)"))
        elif mech in ("off", "unavailable"):
            rows.append(("page heat (tier_heat_every)",
                         "off: whole records dropped round-robin" if mech == "off"
                         else "unavailable on this kernel: whole records dropped round-robin"))
    fps = faults_per_step(p)
    if fps is not None:
        rows.append(("major faults per step", fmt.num(round(fps, 1))))
    for key, name in ((P.DISK_WRITTEN_BYTES, "disk written (child)"), (P.DISK_READ_BYTES, "disk read (child)")):
        v = get(report, "process." + key)
        if fmt.is_num(v):
            rows.append((name, fmt.nbytes(v) + (_own_files_words(report, v) if key == P.DISK_WRITTEN_BYTES else "")))
    recs = [r for r in (get(p, PM.RECORDS) or []) if isinstance(r, dict)]
    if recs:
        view["tables"].append(("largest pooled allocations (while training)",
                               ["offset", "bytes", "resident", "of it in DRAM head", "hot fraction"],
                               [[fmt.nbytes(r.get("offset")), fmt.nbytes(r.get("bytes")),
                                 fmt.nbytes(r.get("resident_bytes")), fmt.nbytes(r.get("dram_head_bytes") or 0),
                                 fmt.pct(r.get("hot_fraction"))] for r in recs]))
    return view


def series(report: Dict[str, Any]) -> Tuple[List[Tuple[float, float]], List[Tuple[float, float]]]:
    """(t_s, pool bytes resident) and (t_s, major faults per second between samples)."""
    p = _pmem(report)
    tl = [x for x in (get(p, PM.TIMELINE) or [])] if p else []
    res = [(x["t_s"], x["resident_bytes"]) for x in tl if fmt.is_num(x.get("t_s"))]
    rate = []
    for a, b in zip(tl, tl[1:]):
        dt = b["t_s"] - a["t_s"]
        if dt > 0:
            rate.append((b["t_s"], (b["major_faults"] - a["major_faults"]) / dt))
    return res, rate
