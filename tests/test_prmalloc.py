# test_prmalloc.py -- PRMalloc (librtkit_malloc.so) end to end: C tests under LD_PRELOAD, unit and ASan tests, settings, plans, TF.
import glob
import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import REPO, preload_env as _env, requires_tf
from rtkit.report import alloc_steps, glossary

BUILD = os.path.join(REPO, "allocators", "build.py")
pytestmark = pytest.mark.timeout(300)

# fast plans for short test programs
FAST = {"RTKIT_MALLOC_PROFILE_START": "0", "RTKIT_MALLOC_PROFILE_STABLE": "2", "RTKIT_MALLOC_PROFILE_MAX": "10"}


def run_c(native, name, args=(), extra=None, preload=True, timeout=120):
    exe = os.path.join(native, "tests", name)
    return subprocess.run([exe, *args], env=_env(native, extra, preload), capture_output=True, text=True,
                          timeout=timeout)


def stats(run_dir):
    files = sorted(glob.glob(os.path.join(run_dir, "allocator-*.json")))
    assert files, f"no allocator-*.json in {run_dir}: {os.listdir(run_dir)}"
    docs = [alloc_steps.load_file(f) for f in files]
    return max(docs, key=lambda d: d["steps"])


def test_every_entry_point_and_arena_realloc(prm, tmp_path):
    proc = run_c(prm, "prmalloc_api", extra={**FAST, "RTKIT_RUN_DIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "prmalloc_api: ok\n"
    doc = stats(tmp_path)
    assert doc["schema_version"] == 2 and doc["state"] == "planned"
    assert doc["plan"]["source"] == "profiled"
    sizes = [c["size_bytes"] for c in doc["plan"]["classes"]]
    assert 1 << 20 in sizes and 300 << 10 in sizes
    t = doc["totals"]
    assert t["arena_hits"] > 0 and t["fallbacks"] > 0 and t["small_calls"] > 0
    assert t["memalign_calls"] > 0 and t["calloc_calls"] > 0 and t["realloc_calls"] > 0
    assert 0 < doc["hit_rate"] < 1
    assert doc["per_step"] and doc["per_step"][-1]["step"] == doc["steps"] - 1
    assert os.path.exists(os.path.join(tmp_path, "malloc-plan.txt"))


def test_multithreaded_stress_with_churn(prm, tmp_path):
    # concurrency varies run to run, so the plan may never be "stable": cap profiling at 4 of 8 rounds
    proc = run_c(prm, "prmalloc_stress", args=["8"],
                 extra={**FAST, "RTKIT_MALLOC_PROFILE_MAX": "4", "RTKIT_RUN_DIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "state 3" in proc.stderr
    doc = stats(tmp_path)
    assert doc["totals"]["arena_hits"] > 0
    assert doc["totals"]["free_calls"] > 100000


def test_stress_debug_mode_finds_no_double_free(prm, tmp_path):
    proc = run_c(prm, "prmalloc_stress", args=["2"],
                 extra={**FAST, "RTKIT_MALLOC_DEBUG": "1", "RTKIT_RUN_DIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "double free" not in proc.stderr
    assert stats(tmp_path)["totals"]["debug_errors"] == 0


def test_fork_from_threads_and_fork_exec(prm, tmp_path):
    proc = run_c(prm, "prmalloc_fork", extra={**FAST, "RTKIT_RUN_DIR": str(tmp_path)}, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("prmalloc_fork(exec child): ok") == 5
    # the parent, the 40 forked children (each marked a step) and the exec'd children write their own files
    pids = {json.load(open(f))["pid"] for f in glob.glob(os.path.join(tmp_path, "allocator-*.json"))}
    assert len(pids) >= 40


def test_unit_planner_arena_env(prm):
    proc = run_c(prm, "prmalloc_unit_plan", preload=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "prmalloc_unit_plan: ok\n"


@pytest.mark.slow  # the ASan build
def test_unit_stress_under_asan(prm_asan):
    env = _env(prm_asan, {"RTKIT_MALLOC_PROFILE_START": "0", "ASAN_OPTIONS": "detect_leaks=0"}, preload=False)
    proc = subprocess.run([os.path.join(prm_asan, "tests", "prmalloc_unit_stress")], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "prmalloc_unit_stress: ok" in proc.stdout and "state 3" in proc.stdout


@pytest.mark.slow  # its own build, and memcheck
@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind not installed")
def test_unit_stress_under_valgrind(tmp_path):
    # memcheck over the engine (arenas, stash, profiler, census) with cross-thread frees. The unit build, not the
    # preload: memcheck replaces glibc's allocator, so the preload's glibc chunk-header reads would hit its
    # redzones; --valgrind builds the unit tests to ask malloc_usable_size instead. --fair-sched: the workers spin
    # until the main thread's step marks stop them, which valgrind's default lock starves (2 min instead of ~4 s).
    out = tmp_path / "vg"
    subprocess.run([sys.executable, BUILD, "--tests", "--only", "prmalloc", "--valgrind", "--out", str(out)],
                   check=True, stdout=subprocess.DEVNULL)
    env = _env(str(out), {"RTKIT_MALLOC_PROFILE_START": "0"}, preload=False)
    proc = subprocess.run(["valgrind", "-q", "--fair-sched=yes", "--error-exitcode=1",
                           str(out / "tests" / "prmalloc_unit_stress")], env=env, capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "prmalloc_unit_stress: ok" in proc.stdout and "state 3" in proc.stdout


@pytest.mark.parametrize("var,value", [("RTKIT_MALLOC_MIN_SIZE", "12Q"), ("RTKIT_MALLOC_PROFILE_MAX", "0"),
                                       ("RTKIT_MALLOC_THP", "maybe"), ("RTKIT_MALLOC_PROFILE_START", "-1")])
def test_bad_setting_one_line_and_default_used(prm, tmp_path, var, value):
    """A bad RTKIT_MALLOC_* value falls back to the table's default; the allocator stays on."""
    from rtkit import config as cfg

    ref = run_c(prm, "prmalloc_steps", args=["3", "64K,1M"], extra={})
    proc = run_c(prm, "prmalloc_steps", args=["3", "64K,1M"], extra={var: value, "RTKIT_RUN_DIR": str(tmp_path)})
    assert proc.returncode == 0
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    setting = cfg.BY_ENV[var]
    assert var in lines[0] and repr(value) in lines[0] and f"expected {setting.accepted()}" in lines[0]
    assert f"using the default {setting.to_env(setting.default)!r}" in lines[0]
    # stdout untouched: the program's own line only, the same as with the defaults
    assert proc.stdout == ref.stdout and not ref.stdout.endswith("state 0\n")
    doc = stats(tmp_path)
    assert doc["state"] != "disabled" and len(doc["errors"]) == 1 and var in doc["errors"][0]
    assert doc["config"][setting.key] == setting.default
    # a second process of the same run stays silent (reported once per run)
    again = run_c(prm, "prmalloc_steps", args=["1", "64K"], extra={var: value, "RTKIT_RUN_DIR": str(tmp_path)})
    assert again.returncode == 0 and again.stderr == ""


def test_bad_malloc_switch_one_line_and_passthrough(prm, tmp_path):
    """Only a bad RTKIT_MALLOC itself leaves the allocator a plain pass-through."""
    ref = run_c(prm, "prmalloc_steps", args=["3", "64K,1M"], extra={"RTKIT_MALLOC": "0"})
    proc = run_c(prm, "prmalloc_steps", args=["3", "64K,1M"], extra={"RTKIT_MALLOC": "maybe",
                                                                     "RTKIT_RUN_DIR": str(tmp_path)})
    assert proc.returncode == 0
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and "RTKIT_MALLOC='maybe'" in lines[0] and "pass-through" in lines[0], proc.stderr
    assert proc.stdout == ref.stdout == "prmalloc_steps: 3 steps, 2 sizes, state 0\n"
    doc = stats(tmp_path)
    assert doc["state"] == "disabled" and len(doc["errors"]) == 1


def test_off_writes_nothing(prm, tmp_path):
    proc = run_c(prm, "prmalloc_steps", args=["4", "1M"], extra={"RTKIT_MALLOC": "0", "RTKIT_RUN_DIR": str(tmp_path)})
    assert proc.returncode == 0 and proc.stderr == ""
    assert os.listdir(tmp_path) == []


def test_no_run_dir_writes_nothing_and_census_without_marks(prm, tmp_path):
    proc = run_c(prm, "prmalloc_steps", args=["0", "1M"], extra={})
    assert proc.returncode == 0 and proc.stdout.endswith("state 1\n")
    proc = run_c(prm, "prmalloc_steps", args=["0", "1M"], extra={"RTKIT_RUN_DIR": str(tmp_path)})
    doc = stats(tmp_path)
    assert doc["state"] == "passthrough" and doc["steps"] == 0
    assert doc["totals"]["malloc_calls"] > 0 and doc["plan"]["source"] == "none"
    assert doc["size_classes"] and all(c["count"] > 0 for c in doc["size_classes"])


def test_faults_per_step_after_plan(prm, tmp_path):
    sizes = "5M,9M,13M,700K,700K,300K"
    proc = run_c(prm, "prmalloc_steps", args=["30", sizes],
                 extra={"RTKIT_RUN_DIR": str(tmp_path), "RTKIT_MALLOC_PROFILE_START": "2"})
    assert proc.returncode == 0 and proc.stdout.endswith("state 3\n")
    doc = stats(tmp_path)
    assert doc["plan"]["source"] == "profiled" and doc["profile"]["reason"] == "stable"
    assert doc["profile"]["start_step"] == 2 and doc["profile"]["end_step"] == 5
    # the large-object heap serves these sizes from the first step and keeps their pages: the profiled steps
    # fault little too (glibc alone: > 1000 a step here)
    assert doc["minor_faults_per_step_before_plan"] < 100 and doc["totals"]["large_hits"] > 0
    assert doc["minor_faults_per_step_after_plan"] <= 2
    after = [s for s in doc["per_step"] if s["step"] >= 6]
    assert after and all(s["fallbacks"] == 0 and s["arena_hits"] == 6 for s in after)


def test_plan_save_load_and_reject(prm, tmp_path):
    first, second, third, fourth = (tmp_path / n for n in ("a", "b", "c", "d"))
    for d in (first, second, third, fourth):
        d.mkdir()
    sizes = "1M,2M,300K"
    assert run_c(prm, "prmalloc_steps", args=["10", sizes], extra={**FAST, "RTKIT_RUN_DIR": str(first)}).returncode == 0
    plan = first / "malloc-plan.txt"
    text = plan.read_text()
    assert text.startswith("rtkit-malloc-plan 1\n") and "fingerprint" in text and text.endswith("end\n")

    # the same job with the plan, its process named: arenas from step 0, no profiling
    proc = run_c(prm, "prmalloc_steps", args=["8", sizes],
                 extra={"RTKIT_RUN_DIR": str(second), "RTKIT_MALLOC_PLAN": str(plan),
                        "RTKIT_MALLOC_PLAN_PROCESS": "prmalloc_steps"})
    assert proc.returncode == 0 and proc.stderr == ""
    doc = stats(second)
    assert doc["plan"]["source"] == "loaded" and doc["plan"]["rejected_reason"] is None
    assert doc["profile"]["reason"] == "loaded" and doc["per_step"][0]["arena_hits"] == 3
    assert doc["hit_rate"] == 1.0

    # unnamed: the arenas come with the step mark that ends the warm-up, where profiling would start (a helper
    # that never marks reserves nothing)
    later = tmp_path / "e"
    later.mkdir()
    proc = run_c(prm, "prmalloc_steps", args=["8", sizes],
                 extra={"RTKIT_RUN_DIR": str(later), "RTKIT_MALLOC_PLAN": str(plan),
                        "RTKIT_MALLOC_PROFILE_START": "2"})
    assert proc.returncode == 0 and proc.stderr == ""
    doc = stats(later)
    assert doc["plan"]["source"] == "loaded" and [s["arena_hits"] for s in doc["per_step"][:2]] == [0, 0]
    assert all(s["arena_hits"] == 3 for s in doc["per_step"][2:])
    assert doc["hit_rate_after_plan"] == 1.0

    # another job's sizes: the plan is detected as not matching, retired, and the job is profiled afresh
    proc = run_c(prm, "prmalloc_steps", args=["16", "5M,7M"],
                 extra={**FAST, "RTKIT_MALLOC_PROFILE_START": "1", "RTKIT_RUN_DIR": str(third),
                        "RTKIT_MALLOC_PLAN": str(plan)})
    assert proc.returncode == 0
    doc = stats(third)
    assert "does not match" in doc["plan"]["rejected_reason"]
    assert doc["plan"]["source"] == "profiled" and doc["state"] == "planned"
    assert {c["size_bytes"] for c in doc["plan"]["classes"]} >= {5 << 20, 7 << 20}

    # an edited plan file is refused by its fingerprint
    bad = tmp_path / "edited-plan.txt"
    bad.write_text(text.replace("class 1048576 1", "class 1048576 9"))
    proc = run_c(prm, "prmalloc_steps", args=["6", sizes],
                 extra={**FAST, "RTKIT_RUN_DIR": str(fourth), "RTKIT_MALLOC_PLAN": str(bad)})
    assert proc.returncode == 0
    doc = stats(fourth)
    assert "fingerprint" in doc["plan"]["rejected_reason"] and doc["plan"]["source"] == "profiled"


def test_arena_limit_trims_plan(prm, tmp_path):
    proc = run_c(prm, "prmalloc_steps", args=["10", "1M,8M"],
                 extra={**FAST, "RTKIT_RUN_DIR": str(tmp_path), "RTKIT_MALLOC_ARENA_LIMIT": "4M"})
    assert proc.returncode == 0
    doc = stats(tmp_path)
    assert doc["plan"]["reserved_bytes"] <= 4 << 20 and doc["plan"]["trimmed_to_limit"] is True
    assert [c["size_bytes"] for c in doc["plan"]["classes"]] == [1 << 20]
    assert doc["totals"]["arena_misses"] > 0


TF_SCRIPT = r"""
import ctypes, os
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np
import tensorflow as tf
mark = ctypes.CDLL(None).rtkit_step_mark
tf.compat.v1.disable_eager_execution()
x = tf.compat.v1.placeholder(tf.float32, [512, 1024])
w = tf.Variable(tf.random.normal([1024, 1024]))
y = tf.reduce_sum(tf.nn.relu(tf.matmul(x, w)) * 2.0)
data = np.ones((512, 1024), np.float32)
# one thread each: Eigen's contraction allocates packing buffers per thread that joins it, and which threads join
# depends on scheduling, so with more the count of live blocks (and the hit rate) moved with the machine's load
one = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1, inter_op_parallelism_threads=1)
with tf.compat.v1.Session(config=one) as sess:
    sess.run(tf.compat.v1.global_variables_initializer())
    for _ in range(25):
        sess.run(y, {x: data})
        mark()
print("tf-done")
"""


@requires_tf
def test_tensorflow_under_preload(prm, tmp_path):
    env = _env(prm, {"RTKIT_RUN_DIR": str(tmp_path), "TF_ONEDNN_USE_SYSTEM_ALLOCATOR": "1",
                     "TF_CPP_MIN_LOG_LEVEL": "3"})
    proc = subprocess.run([sys.executable, "-c", TF_SCRIPT], env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("tf-done")
    doc = stats(tmp_path)
    assert doc["steps"] == 25 and doc["state"] == "planned" and doc["plan"]["source"] == "profiled"
    assert doc["totals"]["arena_hits"] > 0 and doc["hit_rate_after_plan"] > 0.9
    after = [s for s in doc["per_step"] if s["step"] >= doc["after_plan_from_step"]]
    assert after and sum(s["arena_hits"] for s in after) > 0
    # the mean and its steps agree: the report's readers take the same steps the C side counted
    samples = glossary.after_plan_faults({"allocator": doc})
    assert samples == [s["minor_faults"] for s in after]
    assert (len(samples), sum(samples)) == (doc["after_plan_steps"], doc["minor_faults_after_plan"])
    assert doc["minor_faults_per_step_after_plan"] == pytest.approx(sum(samples) / len(samples), abs=0.005)
    # recurring exhaustion after the plan (TF ordering ops differently under load) would fault pages every step
    # if glibc unmapped/trimmed the fallback blocks at free: the fallback stash keeps them
    detail = [(s["step"], s["minor_faults"], s["fallbacks"]) for s in after]
    assert doc["minor_faults_per_step_after_plan"] <= 5, \
        f"(step, faults, fallbacks) after the plan: {detail}; totals {doc['totals']}"


def test_debug_mode_reports_double_free(prm, tmp_path):
    proc = run_c(prm, "prmalloc_debug", extra={**FAST, "RTKIT_MALLOC_DEBUG": "1", "RTKIT_RUN_DIR": str(tmp_path)})
    assert proc.returncode == -6, proc.stdout + proc.stderr
    assert "survived" not in proc.stdout
    addr = proc.stderr.splitlines()[0].split()[1]
    assert f"double free of {addr}" in proc.stderr


def test_cxx_new_delete_forms(prm, tmp_path):
    # bad_alloc from the throwing forms (through libstdc++'s new-handler loop), nullptr from nothrow, every form
    # bound to the preload, and each delete form handing its arena block back (LIFO: the next new gets it again)
    proc = run_c(prm, "prmalloc_cxx_new", extra={**FAST, "RTKIT_RUN_DIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "prmalloc_cxx_new: ok\n"
    assert stats(tmp_path)["totals"]["arena_hits"] > 0


def test_recurring_fallbacks_stop_faulting(prm, tmp_path):
    # a class exhausted every step after the plan (as TF does under load when ops run in another order):
    # without the fallback stash glibc unmaps/trims the blocks at free and each step faults ~2000 pages again
    proc = run_c(prm, "prmalloc_exhaust", extra={**FAST, "RTKIT_RUN_DIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "prmalloc_exhaust: ok\n"
    doc = stats(tmp_path)
    t = doc["totals"]
    # the class of one planned block grows to two (twice the plan's), the other two extra blocks fall back
    assert doc["arenas"]["grown_blocks"] == 1 and doc["arenas"]["grown_bytes"] == 2 << 20, doc["arenas"]
    assert t["arena_exhausted"] >= 2 * 14 and t["large_hits"] >= 2 * 13
    # the fallback stash does the same when the large heap is off
    run_dir = tmp_path / "stash"
    run_dir.mkdir()
    proc = run_c(prm, "prmalloc_exhaust", extra={**FAST, "RTKIT_RUN_DIR": str(run_dir), "RTKIT_MALLOC_LARGE": "0"})
    assert proc.returncode == 0, proc.stderr
    t = stats(run_dir)["totals"]
    assert t["arena_exhausted"] >= 2 * 14 and t["fallbacks_reused"] >= 2 * 13 and t["large_hits"] == 0
