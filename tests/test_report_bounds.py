# test_report_bounds.py -- the 'Memory bounds' block on real runs: its figures add up, equal report.json's, read alike everywhere.
import copy
import html as htmllib
import os
import sys

import pytest

from conftest import load_report, run_rtkit
from rtkit.report import bounds, fmt, html as html_mod, summary, terminal
from rtkit.report import glossary as G
from rtkit.report.contract import Bounds as B

PY = sys.executable
STEPS = 12

# the runtime grows before the first step (a 64 MiB buffer held throughout), then each step holds 8 MiB more
# heap than the last (kept in a list), so the steps' live bytes grow by a known amount
SCRIPT = f"""
import ctypes, time, rtkit
base = bytearray(64 << 20)
time.sleep(0.6)             # the sampler (200 ms) sees the runtime before the first step
held = []
for i in range({STEPS}):
    held.append(bytearray(8 << 20))
    time.sleep(0.02)
    rtkit.step()
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    base = tmp_path_factory.mktemp("bounds")
    d = str(base / "run")
    run_rtkit(["run", "--html", "--run-dir", d, "--", PY, "-c", SCRIPT], check_rc=0, timeout=300)
    return d, load_report(d)


def test_bounds_add_up_and_equal_the_measured_figures(run):
    _, rep = run
    b = rep["bounds"]
    assert b is not None, "no bounds section in report.json"
    assert b[B.PEAK_RSS_BYTES] == rep["process"]["peak_rss_bytes"]
    # the baseline is a real sample: the last one taken before the first step began
    first_t = rep["steps"]["per_step"][0]["t_s"]
    before = [s for s in rep["process"]["samples"] if s["t_s"] <= first_t and s["rss_bytes"] > 0]
    assert before and b[B.BASELINE_RSS_BYTES] == before[-1]["rss_bytes"] and b[B.BASELINE_AT_S] == before[-1]["t_s"]
    assert b[B.BASELINE_RSS_BYTES] > 64 << 20          # the 64 MiB the script held before its first step
    assert b[B.BASELINE_RSS_BYTES] + b[B.GROWTH_BYTES] == b[B.PEAK_RSS_BYTES]
    # rtkit's allocator measured the heap: growth = heap the steps added + overhead, exactly
    a = rep["allocator"]
    assert b[B.PEAK_LIVE_BYTES] == a["totals"]["peak_live_bytes"]
    step0 = [x for x in a["per_step"] if x["step"] == 0][0]
    assert b[B.FIRST_STEP_LIVE_BYTES] == step0["live_bytes"]
    assert b[B.STEP_LIVE_BYTES] == b[B.PEAK_LIVE_BYTES] - b[B.FIRST_STEP_LIVE_BYTES]
    assert b[B.STEP_LIVE_BYTES] + b[B.OVERHEAD_BYTES] == b[B.GROWTH_BYTES]
    # the steps after the first held 11 x 8 MiB more: the live figure sees them (glibc's books, mmapped blocks)
    assert (STEPS - 1) * (8 << 20) <= b[B.STEP_LIVE_BYTES] <= (STEPS + 2) * (8 << 20), b
    assert b[B.ESTIMATES] == [B.STEP_LIVE_BYTES, B.OVERHEAD_BYTES, B.OVER_RUNTIME_BYTES]
    assert b[B.RTKIT_IDLE_BYTES] == a["large_heap"]["idle_bytes"] + a["arenas"]["free_bytes"]


def test_terminal_and_html_show_report_json_figures(run):
    d, rep = run
    b = rep["bounds"]
    text = run_rtkit(["report", d], env={"COLUMNS": "250"}, check_rc=0).stdout
    block = text[text.index("Memory bounds"):]
    block = block[:block.index("\n\n")]
    eq = (f"peak RSS {fmt.nbytes(b[B.PEAK_RSS_BYTES])} = RSS before the first step {fmt.nbytes(b[B.BASELINE_RSS_BYTES])}"
          f" + heap the steps added (estimate) {fmt.nbytes(b[B.STEP_LIVE_BYTES])}"
          f" + RSS overhead (estimate) {fmt.nbytes(b[B.OVERHEAD_BYTES])}")
    assert eq in block, block
    with open(os.path.join(d, "report.html")) as fh:
        page = htmllib.unescape(fh.read())
    assert eq in page
    over = bounds.over_live_equation(b)
    assert over and over.startswith(f"RSS over live {fmt.nbytes(b[B.OVER_LIVE_BYTES])} = arenas idle ")
    assert over in block and over in page, block
    for fid in bounds.FIGURE_IDS:
        v = G.value(rep, fid)
        assert v is not None, fid
        row = f"{G.name(fid)}  "
        line = [l for l in block.splitlines() if l.strip().startswith(row.strip())]
        assert line and G.FIGURES[fid].text(v) in line[0], (fid, block)
        assert f"<td>{G.FIGURES[fid].text(v)}" in page.split(f">{G.name(fid)}</td>", 1)[1][:80], fid


def test_rss_over_live_is_split_by_component_at_the_largest_footprint(run):
    _, rep = run
    b, a = rep["bounds"], rep["allocator"]
    fp = a["peak_footprint"]
    # the steps held 8 MiB more each: the heap's footprint was largest at one of the last step ends
    assert fp["step"] >= STEPS - 2, fp
    live = {x["step"]: x["live_bytes"] for x in a["per_step"]}
    assert fp["live_bytes"] == live[fp["step"]]
    assert b[B.FOOTPRINT_STEP] == fp["step"] and b[B.FOOTPRINT_LIVE_BYTES] == fp["live_bytes"]
    assert b[B.OVER_LIVE_BYTES] == b[B.PEAK_RSS_BYTES] - fp["live_bytes"]
    assert (b[B.OVER_ARENAS_BYTES], b[B.OVER_LARGE_IDLE_BYTES], b[B.OVER_GLIBC_BYTES]) == (
        fp["arena_idle_bytes"], fp["large_idle_bytes"], fp["glibc_free_bytes"])
    parts = b[B.OVER_ARENAS_BYTES] + b[B.OVER_LARGE_IDLE_BYTES] + b[B.OVER_GLIBC_BYTES] + b[B.OVER_RUNTIME_BYTES]
    assert parts == b[B.OVER_LIVE_BYTES]
    # the rest is the interpreter and its libraries (the 64 MiB buffer is heap live)
    assert b[B.OVER_RUNTIME_BYTES] > 0 and B.OVER_RUNTIME_BYTES in b[B.ESTIMATES]
    line = summary.memory_line(rep)
    assert f"RSS over live {fmt.nbytes(b[B.OVER_LIVE_BYTES])} (arenas idle " in line and "runtime and the rest" in line
    # compare shows each part side by side
    from rtkit.report import compare
    text = compare.render(rep, rep, width=200)
    for fid in ("over_live_bytes", "over_live_large_idle_bytes", "over_live_runtime_bytes"):
        assert G.name(fid) in text, fid
    # without the allocator's footprint: no split, nothing invented
    old = copy.deepcopy(rep)
    del old["allocator"]["peak_footprint"]
    nb = bounds.build(old)
    assert nb[B.OVER_LIVE_BYTES] is None and nb[B.OVER_RUNTIME_BYTES] is None and B.OVER_RUNTIME_BYTES not in nb[B.ESTIMATES]
    old["bounds"] = nb
    assert "RSS over live" not in terminal.render(old, width=200)


def test_without_the_allocator_only_measured_terms_are_shown(run):
    _, rep = run
    plain = copy.deepcopy(rep)
    plain["allocator"] = None
    b = bounds.build(plain)
    assert b[B.GROWTH_BYTES] == rep["bounds"][B.GROWTH_BYTES]
    assert b[B.STEP_LIVE_BYTES] is None and b[B.OVERHEAD_BYTES] is None and b[B.ESTIMATES] == []
    plain["bounds"] = b
    text = terminal.render(plain, width=200)
    assert "RSS growth while training" in text and "heap the steps added" not in text and "RSS overhead" not in text
    # no sample before the first step: no block, one line saying why
    none = copy.deepcopy(rep)
    none["process"]["samples"] = [s for s in none["process"]["samples"] if s["t_s"] > none["steps"]["per_step"][0]["t_s"]]
    none["bounds"] = bounds.build(none)
    assert none["bounds"] is None
    assert "Memory bounds: no RSS sample before the first step" in terminal.render(none)
    html_mod.render(none)


def test_bench_metrics_read_the_bounds(run):
    from rtkit.bench import stats
    _, rep = run
    m = stats.metrics_from_report(rep)
    assert m["rss_growth_bytes"] == rep["bounds"][B.GROWTH_BYTES]
    assert m["rss_over_live_bytes"] == rep["bounds"][B.OVERHEAD_BYTES]


def test_a_tables_pages_in_the_tier_pool_count_as_live_not_over_live(tmp_path):
    """The same script with and without a tier pool: a 64 MiB table written whole, then steps. In the pool the table
    is the file's page cache, which the heap's books do not hold; RSS over live counts it as live all the same (the
    pool's live bytes in DRAM at its highest RSS sample), so both runs are about the same distance from live. Counted
    as over live, the pool run's figure would be 64 MiB higher."""
    script = ("import rtkit\n"
              "table = bytearray(64 << 20)\n"
              "for i in range(8):\n"
              "    table[::4096] = bytes([i + 1]) * (len(table) // 4096)\n"
              "    rtkit.step()\n")
    over = {}
    for name, extra in (("dram", []), ("pool", ["--set", f"tier_pool_path={tmp_path / 'table.pool'}", "--set", "tier_min_size=1M"])):
        d = str(tmp_path / name)
        run_rtkit(["run", "--quiet", "--run-dir", d, *extra, "--", PY, "-c", script], check_rc=0, timeout=300)
        rep = load_report(d)
        b = rep["bounds"]
        over[name] = b[B.OVER_LIVE_BYTES]
        if name == "pool":
            assert b[B.POOL_LIVE_DRAM_BYTES] is not None and b[B.POOL_LIVE_DRAM_BYTES] >= 64 << 20, b
            assert b[B.OVER_LIVE_BYTES] == b[B.PEAK_RSS_BYTES] - b[B.FOOTPRINT_LIVE_BYTES] - b[B.POOL_LIVE_DRAM_BYTES]
            rows = dict(bounds.rows(rep))
            assert "and the tier pool's live bytes in DRAM" in rows[G.name("over_live_bytes")], rows
        else:
            assert b[B.POOL_LIVE_DRAM_BYTES] is None, b
    assert over["pool"] < over["dram"] + (24 << 20), over


# each step makes four large buffers of different sizes, one after the other (each freed before the next): four plan
# classes of one block each, of which a step holds one at a time
SEQUENTIAL_SIZES = """
import rtkit
for i in range(16):
    for mib in (12, 24, 48, 96):   # four size classes
        buf = bytearray(mib << 20)   # zero-filled: every page touched
        del buf
    rtkit.step()
"""


def test_arenas_reserving_far_more_than_a_step_holds_at_once_are_warned_of(tmp_path):
    """tensorflow/recommenders' retrieval example (in-batch softmax over 8,192 x 8,192 scores: classes of 256 and 512
    MiB) ran at 2.31 GiB of peak RSS under rtkit's plan and 1.79 GiB with malloc=off, and the summary only said "arena
    bytes reserved 1.33 GiB (a step's planned sizes at most 824.9 MiB live at once)". Each class is sized by its own
    peak, so classes that peak at different moments sit idle, yet resident, while the others peak. The allocator line
    now warns, with the excess, its share of the peak RSS and the run that shows the job without the plan."""
    planned, off = str(tmp_path / "planned"), str(tmp_path / "off")
    # with every size in a class, as before malloc_class_max (its default leaves the 96 MiB one to the large heap)
    proc = run_rtkit(["run", "--run-dir", planned, "--set", "malloc_class_max=1G", "--", PY, "-c", SEQUENTIAL_SIZES],
                     check_rc=0, timeout=300)
    rep = load_report(planned)
    reserved, at_once = G.value(rep, "reserved_bytes"), G.value(rep, "plan_step_peak_bytes")
    assert rep["allocator"]["state"] == "planned" and len(rep["allocator"]["plan"]["classes"]) == 4, rep["allocator"]
    excess = reserved - at_once
    assert excess >= 64 << 20, (reserved, at_once)
    line = next(l for l in proc.stderr.splitlines() if l.startswith("rtkit: allocator:"))
    assert (f"warning: the arenas reserve {fmt.nbytes(excess)} more than a step's planned sizes hold at once "
            f"({excess / G.value(rep, 'peak_rss_bytes'):.0%} of peak RSS") in line, line
    assert "--set malloc=off shows the peak RSS without the plan" in line, line
    # true of the memory: the run it names (glibc returns each buffer) peaks lower by about the excess
    run_rtkit(["run", "--run-dir", off, "--set", "malloc=off", "--", PY, "-c", SEQUENTIAL_SIZES], check_rc=0,
              timeout=300)
    saved = rep["process"]["peak_rss_bytes"] - load_report(off)["process"]["peak_rss_bytes"]
    assert saved >= 0.8 * excess, (saved, excess)


GIANT_SIZES = SEQUENTIAL_SIZES.replace("(12, 24, 48, 96)", "(80, 96, 112, 128)")


def test_blocks_above_malloc_class_max_share_the_large_heaps_pages(tmp_path):
    """Four sizes above malloc_class_max (64 MiB), one live at a time: no class is planned and the large heap serves
    them, sharing its pages across the sizes; with a class each (malloc_class_max=1G) every class holds its block
    for the whole run. Both keep the pages for reuse: no fault a step after the first."""
    shared, classes = str(tmp_path / "shared"), str(tmp_path / "classes")
    proc = run_rtkit(["run", "--run-dir", shared, "--", PY, "-c", GIANT_SIZES], check_rc=0, timeout=300)
    run_rtkit(["run", "--run-dir", classes, "--set", "malloc_class_max=1G", "--", PY, "-c", GIANT_SIZES], check_rc=0,
              timeout=300)
    a, b = load_report(shared), load_report(classes)
    assert a["allocator"]["state"] == "passthrough" and a["allocator"]["plan"]["sizes_above_class_max"] == 4, a["allocator"]
    assert ("passthrough, no plan (every recurring size is above malloc_class_max: the large heap serves them)"
            in proc.stderr), proc.stderr
    assert b["allocator"]["state"] == "planned" and b["allocator"]["plan"]["reserved_bytes"] >= 384 << 20, b["allocator"]
    # the classes hold 384 MiB or more (the planner's cheapest spacing: a 128 MiB and a 256 MiB block), the shared
    # pages the largest block's 128 MiB and the large heap's idle rest: 256 MiB apart on this machine
    saved = b["process"]["peak_rss_bytes"] - a["process"]["peak_rss_bytes"]
    assert saved >= 200 << 20, (saved, a["process"]["peak_rss_bytes"], b["process"]["peak_rss_bytes"])
    assert G.value(a, "faults_per_step_median") == 0 == G.value(b, "faults_per_step_median"), (a["steps"]["summary"],
                                                                                         b["steps"]["summary"])


def test_arenas_near_a_steps_peak_get_no_warning(run):
    _, rep = run
    assert "warning: the arenas reserve" not in " ".join(summary.lines(rep))
