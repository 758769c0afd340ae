# test_tier_heat.py -- tier mode's heat-driven resident budget: hot pages kept, cold ones dropped, data and losses kept.
import glob
import json
import os
import subprocess
import sys

import pytest

from conftest import load_report, requires_tf, run_rtkit
from rtkit.report import fmt

pytestmark = pytest.mark.timeout(600)
MIB = 1 << 20


def _kernel_has_heat():
    """PAGEMAP_SCAN (and userfaultfd's WP_ASYNC) came with Linux 6.7."""
    try:
        major, minor = (int(x) for x in os.uname().release.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= (6, 7)


def _pmem_doc(run_dir, children=0):
    """The program's pmem-<pid>.json (its forked children that mark steps write their own, state forked_child)."""
    files = glob.glob(os.path.join(run_dir, "pmem-*.json"))
    assert len(files) == 1 + children, os.listdir(run_dir)
    docs = []
    for f in files:
        with open(f) as fh:
            docs.append(json.load(fh))
    mine = [d for d in docs if d["state"] != "forked_child"]
    assert len(mine) == 1 and all(d["heat"].get("on_worker") is not True for d in docs if d not in mine), docs
    return mine[0]


def _run_heat(native, tmp_path, extra, program="prmalloc_heat", children=0):
    run_dir, pool = tmp_path / "run", tmp_path / "pool"
    run_dir.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RTKIT_") and k != "LD_PRELOAD"}
    env.pop("_RTKIT_MALLOC_ROOT", None)
    env.update({"LD_PRELOAD": os.path.join(native, "librtkit_malloc.so"), "RTKIT_RUN_DIR": str(run_dir),
                "RTKIT_TIER_POOL_PATH": str(pool), "RTKIT_TIER_RESIDENT_MAX": str(8 * MIB),
                # not a whole number of pages: the watch covers the mapping's whole pages
                "RTKIT_TIER_POOL_SIZE": str((200 << 20) + 1)}, **extra)
    program, *args = program.split()
    proc = subprocess.run([os.path.join(native, "tests", program), *args], env=env, capture_output=True, text=True,
                          timeout=300)
    return proc, _pmem_doc(run_dir, children)


def test_heat_keeps_the_hot_pages_and_drops_the_cold_ones(prm, tmp_path):
    """A 64 MiB table under an 8 MiB budget, heat sampled at every mark: two 1 MiB ranges rewritten every step
    (one at the table's start, the first thing a round-robin budget drops) stay in DRAM, the never-rewritten
    rest goes (the C program checks with mincore), every page reads as last written after the drops, a child
    forked mid-run and a thread freeing pool records meanwhile included."""
    proc, doc = _run_heat(prm, tmp_path, {"RTKIT_TIER_HEAT_EVERY": "1"})
    heat = doc["heat"]
    if not _kernel_has_heat():
        pytest.skip(f"Linux < 6.7 cannot measure page heat: {doc['notes']}")
    assert proc.returncode == 0 and proc.stdout == "prmalloc_heat: ok\n", proc.stderr
    assert heat["mechanism"] == "pagemap_scan" and heat["every_steps"] == 1 and heat["chunk_bytes"] == 64 << 10
    assert heat["samples"] == 64 and heat["watch_errors"] == 0, heat            # one per mark after the first
    # the cold chunks were written out and dropped; the passing window's chunks came back when it rewrote them
    assert heat["chunks_demoted"] > (64 * MIB - 8 * MIB) // (64 << 10) and heat["demoted_bytes"] >= 48 * MIB, heat
    assert heat["chunks_promoted"] > 0 and heat["written_out_bytes"] > 0 and heat["pages_written_seen"] > 0, heat
    # the two hot ranges, 16 chunks each, were written at the last sample (and the window's 4)
    assert 32 <= heat["hot_chunks"] <= 32 + 8, heat
    assert heat["resident_bytes"] <= 8 * MIB, heat                              # the budget held after the last pass
    assert doc["budget_dropped_bytes"] >= heat["demoted_bytes"] and not any("heat" in n for n in doc["notes"])


def _run_worker(native, tmp_path, mode):
    """prmalloc_heat_worker in `mode` (free, fork, exit), heat sampled at every mark; a program that hangs (a child
    waiting for a worker it has not, an exit joining a worker that never stops) fails the test at the timeout."""
    try:
        return _run_heat(native, tmp_path, {"RTKIT_TIER_HEAT_EVERY": "1"}, program="prmalloc_heat_worker " + mode,
                         children=int(mode == "fork"))
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"prmalloc_heat_worker {mode} hung: {exc}")


def test_a_pass_held_while_records_are_freed_and_made_again_leaves_the_new_ones_alone(prm, tmp_path):
    """The heat pass runs on the allocator's worker thread, started at the first mark (one thread more then, none
    before). A pass held after its sample and its copy of the live records while 8 of them are freed and made again
    in their place and written: let go, it drops the cold pages it sampled (the table's) but none of the new records'
    (the pool's newest writes), counts the freed ones skipped, and every byte reads back as last written."""
    proc, doc = _run_worker(prm, tmp_path, "free")
    if not _kernel_has_heat():
        pytest.skip(f"Linux < 6.7 cannot measure page heat: {doc['notes']}")
    assert proc.returncode == 0 and proc.stdout == "prmalloc_heat_worker: ok\n", proc.stderr
    heat = doc["heat"]
    assert heat["on_worker"] is True and heat["records_skipped"] >= 8, heat
    assert heat["mark_seconds"] <= heat["seconds"] + 1.0, heat  # the marks only ask; 1 s: the first mark arms


def test_a_child_forked_while_a_pass_is_held_has_no_worker_and_the_parent_goes_on(prm, tmp_path):
    """fork while the worker's pass is held half way: the child finds no worker (waiting returns at once, no thread
    but its own), marks steps without starting one, frees and exits through its destructors; the parent's pass goes
    on once let go and the next steps' passes run."""
    proc, doc = _run_worker(prm, tmp_path, "fork")
    if not _kernel_has_heat():
        pytest.skip(f"Linux < 6.7 cannot measure page heat: {doc['notes']}")
    assert proc.returncode == 0 and proc.stdout == "prmalloc_heat_worker: ok\n", proc.stderr
    assert doc["heat"]["on_worker"] is True and doc["heat"]["samples"] >= 8, doc["heat"]


def test_exit_with_a_pass_held_ends_it_and_writes_the_stats(prm, tmp_path):
    """main returns while the worker's pass is held: the exit ends the pass, joins the worker (no hang), writes the
    stats, and the pool's file is gone."""
    proc, doc = _run_worker(prm, tmp_path, "exit")
    if not _kernel_has_heat():
        pytest.skip(f"Linux < 6.7 cannot measure page heat: {doc['notes']}")
    assert proc.returncode == 0 and proc.stdout == "prmalloc_heat_worker: ok\n", proc.stderr
    assert doc["heat"]["on_worker"] is True and not os.path.exists(tmp_path / "pool")


def test_heat_off_keeps_the_round_robin_budget(prm, tmp_path):
    """tier_heat_every=0: the budget drops whole records round-robin at the stats writes, as without heat."""
    proc, doc = _run_heat(prm, tmp_path, {"RTKIT_TIER_HEAT_EVERY": "0"})
    assert doc["heat"]["mechanism"] == "off" and doc["heat"]["samples"] == 0, doc["heat"]
    assert doc["budget_passes"] >= 1 and doc["budget_dropped_bytes"] > 0


def test_heat_budget_keeps_the_pages_the_lookahead_wants_for_one_mark(prm, tmp_path):
    """rtkit_tier_want (the scheduler's lookahead says which pool pages its next step uses): under an 8 MiB budget
    over at every mark, one unwritten page in each 64 KiB of a 48 MiB cold range, read ahead, stays in DRAM through
    the mark while the other pages of those chunks go (the C program checks with mincore at every step); a want of
    12 MiB, more than the budget, still lets the budget reach its goal, dropping wanted pages last; pages wanted
    once are cold again at the next mark; every page reads as last written, with a forked child (which records
    nothing) and a thread wanting and freeing pool records while the steps mark."""
    proc, doc = _run_heat(prm, tmp_path, {"RTKIT_TIER_HEAT_EVERY": "1"}, program="prmalloc_want")
    heat = doc["heat"]
    if not _kernel_has_heat():
        pytest.skip(f"Linux < 6.7 cannot measure page heat: {doc['notes']}")
    assert proc.returncode == 0 and proc.stdout == "prmalloc_want: ok\n", proc.stderr
    assert heat["mechanism"] == "pagemap_scan" and heat["lookahead_calls"] >= 24, heat
    # each step's one page in 16 of the cold range (12,288 pages from page 4,096), one step's 3,072 pages, 1 MiB at
    # the end, the thread's 16 x 2 wants of 255 pages: every page said, none outside the pool
    steps = sum(len(range(4096 + s % 16, 16383, 16)) for s in range(1, 25) if s != 16)
    assert heat["lookahead_pages"] == steps + 3072 + 256 + 32 * 255, heat
    assert heat["lookahead_kept_pages"] > 0 and heat["lookahead_dropped_pages"] > 0, heat


def test_without_the_heat_budget_the_lookahead_records_nothing(prm, tmp_path):
    """tier_heat_every=0 (no heat budget): rtkit_tier_want and its counts say -1, nothing is kept, the job runs."""
    proc, doc = _run_heat(prm, tmp_path, {"RTKIT_TIER_HEAT_EVERY": "0"}, program="prmalloc_want")
    assert proc.returncode == 0 and proc.stdout == "prmalloc_want: ok\n", proc.stderr
    assert doc["heat"]["mechanism"] == "off" and doc["heat"]["lookahead_pages"] == 0, doc["heat"]


@requires_tf
def test_frequency_rows_under_a_heat_budget_train_like_dram(tmp_path):
    """Frequency-ordered rows (the most used at each table's front) in a pool held to 24 MiB resident, heat
    sampled every 2 steps: the budget only moves pages, so the losses are DRAM's to the bit."""
    def wdl(run_dir, sets):
        args = ["run", "--run-dir", str(run_dir)]
        for s in sets:
            args += ["--set", s]
        args += ["--", sys.executable, "-m", "rtkit.workloads", "wdl", "--table-gb", "0.25", "--steps", "25",
                 "--batch", "256", "--ids", "zipf", "--distinct", "50000", "--print-losses", "--no-progress",
                 "--row-assign", "frequency", "--table-fill", "lazy"]
        proc = run_rtkit(args, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return [line for line in proc.stdout.splitlines() if line.startswith("loss ")]

    dram = wdl(tmp_path / "dram", [])
    tier = wdl(tmp_path / "tier", [f"tier_pool_path={tmp_path / 'pool'}", f"tier_pool_size={600 * MIB + 1}",
                                   f"tier_resident_max={24 * MIB}", "tier_heat_every=2", "tier_dram_head=0"])
    assert len(dram) == 25 and tier == dram
    p = load_report(tmp_path / "tier")["pmem"]
    assert p["state"] == "on" and p["tier_last_step_bytes"] >= 240 * MIB
    heat = p["heat"]
    if not _kernel_has_heat():
        pytest.skip(f"Linux < 6.7 cannot measure page heat: {p['notes']}")
    assert heat["mechanism"] == "pagemap_scan" and heat["samples"] >= 10, heat   # marks 2, 4, ..., 24 at least
    assert heat["chunks_demoted"] > 0 and heat["demoted_bytes"] > 0, heat


# A Keras fit of one embedding table, 24 train batches of 32 x 8 Zipf ids over 100k rows (25.6 MB of table): Keras 3,
# or Keras 2 (tf_keras) with a third argument "keras2"; each batch ends 0.1 s after its step, so that the tier's
# timeline (a sample a second at most) has samples between the first step and the exit.
KERAS_TABLE_FIT = r"""
import os
import sys
import time
if sys.argv[2:] == ["keras2"]:
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
import numpy as np
import tensorflow as tf
keras = tf.keras
keras.utils.set_random_seed(0)
rng = np.random.RandomState(0)
ids = (rng.zipf(1.3, size=(32 * 24, 8)) % 100000).astype("int32")
y = rng.rand(32 * 24, 1).astype("float32")
inputs = keras.Input((8,), dtype="int32")
x = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(100000, 64)(inputs))
model = keras.Model(inputs, keras.layers.Dense(1)(x))
model.compile(optimizer=keras.optimizers.Adam() if sys.argv[1] == "adam" else keras.optimizers.SGD(), loss="mse")
pause = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: time.sleep(0.1))
model.fit(ids, y, batch_size=32, epochs=1, verbose=0, callbacks=[pause])
print("fit-done", keras.__name__)
"""


@requires_tf
@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_summary_warns_when_the_steps_write_the_whole_tables(prm, tmp_path, optimizer):
    """Keras 3's Adam updates the whole embedding table and both moments every step (it turns the gradient's
    IndexedSlices into a dense tensor: every row's moments decay), so under a resident budget tier mode writes the
    tables out and reads them back every few steps: the summary's tier line says so, with the optimizer to use. SGD
    without momentum writes only the rows looked up: no such warning."""
    script = tmp_path / "fit.py"
    script.write_text(KERAS_TABLE_FIT)
    run_dir = tmp_path / "run"
    proc = run_rtkit(["run", "--run-dir", str(run_dir), "--set", f"tier_pool_path={tmp_path / 'pool'}",
                      "--set", "tier_resident_max=8M", "--set", "tier_dram_head=0", "--",
                      sys.executable, str(script), optimizer], timeout=400, env={"RTKIT_LIB_DIR": prm})
    assert proc.returncode == 0 and "fit-done keras" in proc.stdout, proc.stdout + proc.stderr[-3000:]
    pmem = load_report(run_dir)["pmem"]
    if pmem["heat"]["mechanism"] != "pagemap_scan":
        pytest.skip(f"no page heat here: {pmem['notes']}")
    heat, held = pmem["heat"], pmem["tier_last_step_bytes"]
    assert heat["samples"] >= 2, heat
    written = heat["pages_written_seen"] * 4096 / heat["samples"]
    tier_line = [line for line in proc.stderr.splitlines() if line.startswith("rtkit: tier: ")]
    assert len(tier_line) == 1, proc.stderr[-3000:]
    assert "left it in the steps after" not in tier_line[0], tier_line   # Keras 3 keeps its tables in the pool
    if optimizer == "adam":   # table and two moments, 76.8 MB, all written between two samples
        assert held >= 3 * 100000 * 64 * 4 and written >= 0.9 * held, (held, heat)
        assert "warning: the steps write the whole tables, not only the rows they look up" in tier_line[0], tier_line
        assert "use an optimizer that updates only the rows looked up" in tier_line[0], tier_line
        assert "a tier_resident_max of " in tier_line[0], tier_line
    else:                     # the table alone; 4 steps write at most 1,024 rows, 1 MiB of 25.6 MB
        assert held >= 100000 * 64 * 4 and written <= 0.1 * held, (held, heat)
        assert "write the whole tables" not in tier_line[0], tier_line


@requires_tf
def test_summary_says_the_bytes_of_the_tier_fallbacks(prm, tmp_path):
    """A pool too small for the table: the table falls back to DRAM, and the summary's fallback count says its bytes
    (one fallback may be a whole table; the count alone does not tell)."""
    script = tmp_path / "fit.py"
    script.write_text(KERAS_TABLE_FIT)
    run_dir = tmp_path / "run"
    proc = run_rtkit(["run", "--run-dir", str(run_dir), "--set", f"tier_pool_path={tmp_path / 'pool'}",
                      "--set", "tier_pool_size=16M", "--", sys.executable, str(script), "sgd"], timeout=400,
                     env={"RTKIT_LIB_DIR": prm})
    assert proc.returncode == 0 and "fit-done keras" in proc.stdout, proc.stdout + proc.stderr[-3000:]
    pmem = load_report(run_dir)["pmem"]
    assert pmem["tier_fallbacks"] >= 1 and pmem["tier_fallback_bytes"] >= 100000 * 64 * 4, pmem
    tier_line = [line for line in proc.stderr.splitlines() if line.startswith("rtkit: tier: ")]
    assert len(tier_line) == 1, proc.stderr[-3000:]
    said = f"tier fallbacks to DRAM {fmt.num(pmem['tier_fallbacks'])} ({fmt.nbytes(pmem['tier_fallback_bytes'])} in DRAM)"
    assert said in tier_line[0], tier_line


@requires_tf
def test_summary_warns_when_the_tables_leave_the_pool_in_the_first_steps(prm, tmp_path):
    """A Keras 2 (tf_keras) fit: the embedding table is in the pool at the first step mark, and its buffer is replaced
    in the steps after by one made inside a step, in DRAM (Keras 3's table stays: the test above). The summary says
    so, and its anonymous memory saved is no more than what stayed in the pool."""
    pytest.importorskip("tf_keras")
    from rtkit.report import glossary as G
    script = tmp_path / "fit.py"
    script.write_text(KERAS_TABLE_FIT)
    run_dir = tmp_path / "run"
    proc = run_rtkit(["run", "--run-dir", str(run_dir), "--set", f"tier_pool_path={tmp_path / 'pool'}", "--",
                      sys.executable, str(script), "sgd", "keras2"], timeout=400, env={"RTKIT_LIB_DIR": prm})
    assert proc.returncode == 0 and "fit-done tf_keras" in proc.stdout, proc.stdout + proc.stderr[-3000:]
    report = load_report(run_dir)
    timeline = report["pmem"]["timeline"]
    assert len(timeline) >= 3 and timeline[0]["step"] == 1, timeline
    first, floor = timeline[0]["tier_bytes"], min(x["tier_bytes"] for x in timeline[1:-1])
    assert first >= 100000 * 64 * 4 and floor <= first / 2, timeline
    tier_line = [line for line in proc.stderr.splitlines() if line.startswith("rtkit: tier: ")]
    assert len(tier_line) == 1, proc.stderr[-3000:]
    assert "warning: what the pool held at the first step left it in the steps after" in tier_line[0], tier_line
    assert G.value(report, "dram_saved_bytes") <= floor, (G.value(report, "dram_saved_bytes"), timeline)
