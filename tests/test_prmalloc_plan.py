# test_prmalloc_plan.py -- plans made, loaded and rejected: what they hold, when they apply, what a failing arena falls back to.
import os
import re
import struct

import pytest

from prmalloc_cases import case_ok, run_case
from test_prmalloc import FAST, run_c, stats

pytestmark = pytest.mark.timeout(300)


def plan_text(classes, min_size=32 << 10):
    """A plan file with a valid fingerprint (FNV-1a over size, blocks, align as three little-endian u64)."""
    h = 1469598103934665603
    for c in classes:
        for b in struct.pack("<QQQ", *c):
            h = ((h ^ b) * 1099511628211) & (2 ** 64 - 1)
    reserved = sum((s * n + 4095) // 4096 * 4096 for s, n, _ in classes)
    lines = ["rtkit-malloc-plan 1", "spacing exact", f"min_size {min_size}", f"reserved_bytes {reserved}",
             f"fingerprint {h:016x}", f"classes {len(classes)}"]
    lines += [f"class {s} {n} {a}" for s, n, a in classes] + ["end"]
    return "\n".join(lines) + "\n"


def test_realloc_growth_stays_in_place_once_planned(prm, tmp_path):
    # growing in place, not malloc + copy + free per call once planned (that faults a thousand times glibc's count)
    case_ok(run_case(prm, "realloc_cliff", tmp_path), "realloc_cliff")


def test_rejected_plan_arena_is_released(prm, tmp_path):
    # the arena of a rejected loaded plan of 256 MiB must not stay resident
    plan = tmp_path / "big-plan.txt"
    plan.write_text(plan_text([(64 << 20, 4, 4096)]))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    proc = run_c(prm, "prmalloc_defects", args=["retired_rss"],
                 extra={**FAST, "RTKIT_MALLOC_PROFILE_START": "1", "RTKIT_RUN_DIR": str(run_dir),
                        "RTKIT_MALLOC_PLAN": str(plan)})
    case_ok(proc, "retired_rss")
    assert "does not match" in stats(run_dir)["plan"]["rejected_reason"]


def test_sizes_drifting_after_the_plan_are_served(prm, tmp_path):
    # a profiled plan is re-checked as sizes drift, and more than one arena can be retired
    case_ok(run_case(prm, "drift", tmp_path), "drift")


def test_profiler_overflow_is_counted(prm, tmp_path):
    proc = run_case(prm, "profiler_overflow", tmp_path, {"RTKIT_MALLOC_MIN_SIZE": "64"})
    case_ok(proc, "profiler_overflow")
    assert stats(tmp_path)["profile"]["dropped_allocations"] > 0


def test_arena_setup_failure_falls_back_with_one_line(prm, tmp_path):
    # a plan larger than the address space allows: arena setup fails, the job runs on with one line on stderr
    plan = tmp_path / "huge-plan.txt"
    plan.write_text(plan_text([(1 << 30, 3, 4096)]))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    exe = os.path.join(prm, "tests", "prmalloc_steps")
    import subprocess
    from test_prmalloc import _env
    env = _env(prm, {"RTKIT_RUN_DIR": str(run_dir), "RTKIT_MALLOC_PLAN": str(plan)})
    proc = subprocess.run(["/bin/sh", "-c", f"ulimit -v 1500000; exec {exe} 4 1M"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("prmalloc_steps: 4 steps")
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and "RTKIT_MALLOC_PLAN" in lines[0] and "memory" in lines[0], proc.stderr
    assert stats(run_dir)["plan"]["source"] != "loaded"


def test_loaded_plan_min_size_applies(prm, tmp_path):
    plan = tmp_path / "plan.txt"
    plan.write_text(plan_text([(1 << 20, 1, 4096), (2 << 20, 1, 4096)], min_size=1 << 20))
    proc = run_c(prm, "prmalloc_steps", args=["6", "1M,2M,64K"],
                 extra={"RTKIT_RUN_DIR": str(tmp_path), "RTKIT_MALLOC_PLAN": str(plan)})
    assert proc.returncode == 0, proc.stderr
    doc = stats(tmp_path)
    assert doc["plan"]["source"] == "loaded"
    assert doc["config"]["malloc_min_size"] == 1 << 20


def test_loaded_plan_min_size_leaves_the_setting_in_the_value_array(prm, tmp_path):
    # the plan's min_size is in force (rtk_fastpath); the settings' value array keeps what the user set
    from rtkit import config
    plan = tmp_path / "plan.txt"
    plan.write_text(plan_text([(1 << 20, 1, 4096), (2 << 20, 1, 4096)], min_size=1 << 20))
    proc = run_c(prm, "prmalloc_unit_min_size", args=[str(config.BY_KEY["malloc_min_size"].default), str(1 << 20)],
                 preload=False, extra={"RTKIT_MALLOC_PLAN": str(plan)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout == "prmalloc_unit_min_size: ok\n"


def test_own_plan_accepted_when_blocks_are_held_before_the_first_step(prm, tmp_path):
    # the blocks a job takes before its first step stay live: validation in steps 2..4 must still find free
    # blocks for the job's own plan rather than reject it
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    case_ok(run_c(prm, "prmalloc_defects", args=["held_before_steps"], extra={"RTKIT_RUN_DIR": str(first)}),
        "held_before_steps")
    plan = first / "malloc-plan.txt"
    assert plan.exists()
    proc = run_c(prm, "prmalloc_defects", args=["held_before_steps"],
                 extra={"RTKIT_RUN_DIR": str(second), "RTKIT_MALLOC_PLAN": str(plan)})
    case_ok(proc, "held_before_steps")
    doc = stats(second)
    assert doc["plan"]["source"] == "loaded" and doc["plan"]["rejected_reason"] is None, doc["plan"]
    assert doc["profile"]["profiled_steps"] == 0


def test_plan_classes_reuse_the_large_heaps_resident_pages(prm, tmp_path):
    # the classes hold the heap's own blocks, so installing a plan makes nothing new resident: a fresh span beside
    # the heap's scattered idle pages would double the memory the planned sizes take
    case_ok(run_case(prm, "plan_reuse", tmp_path, {"RTKIT_MALLOC_PROFILE_START": "3"}), "plan_reuse")
    assert stats(tmp_path)["arenas"]["live_bytes"] + stats(tmp_path)["arenas"]["free_bytes"] >= 20 << 20


def test_a_run_still_profiling_says_the_steps_profiled_so_far(prm, tmp_path):
    """A job that ends before its profile does (the summary's "still profiling when the run ended (N steps profiled)")
    reports the steps profiled so far, not the 0 the count holds until profiling ends."""
    import subprocess
    import sys

    from conftest import preload_env

    script = ("import ctypes\nlib = ctypes.CDLL(None)\nfor _ in range(5):\n"
              "    blocks = [bytearray(64 << 10) for _ in range(4)]\n    del blocks\n    lib.rtkit_step_mark()\n"
              "lib.rtkit_malloc_write_stats()\n")
    env = preload_env(prm, {"RTKIT_RUN_DIR": str(tmp_path), "RTKIT_MALLOC_PROFILE_START": "1",
                            "RTKIT_MALLOC_PROFILE_STABLE": "50", "RTKIT_MALLOC_PROFILE_MAX": "100"})
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=120)
    s = stats(str(tmp_path))
    assert s["state"] == "profiling" and s["steps"] == 5, s["state"]
    assert s["profile"]["profiled_steps"] == 5 - s["profile"]["start_step"] == 4, s["profile"]


def _drift_run(prm, tmp_path, rounds, steps, window, sizes_a="1M,2M", sizes_b="3M,5M"):
    proc = run_c(prm, "prmalloc_drift", args=[str(rounds), str(steps), sizes_a, sizes_b],
                 extra={**FAST, "RTKIT_RUN_DIR": str(tmp_path), "RTKIT_MALLOC_DRIFT_STEPS": str(window)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return stats(tmp_path)


def test_a_profiled_plan_whose_sizes_drift_is_made_again(prm, tmp_path):
    # phase A (1M, 2M) is profiled and planned; phase B (3M, 5M) follows: a plan that stays A's serves none of B's
    # blocks. The drift check retires it after a window of 4 steps and plans B; the block kept across the change
    # (served by A's arena) is intact when freed (the program checks it)
    doc = _drift_run(prm, tmp_path, 1, 40, 4)
    assert doc["state"] == "planned" and doc["plan"]["source"] == "profiled"
    assert doc["replans"]["count"] == 1 and doc["replans"]["last_reason"] == "sizes drifted"
    r = doc["replans"]
    # the windows run back to back from the plan: the one the change falls in may be mixed, the next is B's alone
    assert 40 <= r["last_from_step"] < r["last_step"] <= 40 + 2 * 4 + 1, r
    assert r["last_classed"] * 2 < r["last_allocations"]
    assert {c["size_bytes"] for c in doc["plan"]["classes"]} >= {3 << 20, 5 << 20}
    assert doc["arenas"]["retired"] == 1
    # phase B's last 20 steps: both its blocks from the new plan's arena, none from the large heap
    tail = [s for s in doc["per_step"] if 60 <= s["step"] < 79]
    assert len(tail) == 19 and all(s["arena_hits"] >= 2 and s["fallbacks"] == 0 for s in tail), tail
    assert doc["hit_rate_after_plan"] > 0.9
    assert doc["after_plan_from_step"] == doc["plan"]["made_at_step"] > r["last_step"]


def test_a_re_plan_leaves_the_retired_blocks_pages_to_the_next_profile(prm, tmp_path):
    # phase B keeps two of A's sizes (1M, 2M; A's 4M block is the one kept across the change) and adds three (3M,
    # 5M, 6M): 2 of 5 classed, so the plan is made again. The retired arena's free 1M and 2M blocks go back to the
    # large heap with their pages, where B's profile takes them: its first step faults no page of them (B's other
    # sizes were the large heap's, resident, since B began). Released, as before, they were faulted in again: 768
    # pages in that step (checked against the build before this change)
    doc = _drift_run(prm, tmp_path, 1, 40, 4, "4M,1M,2M", "1M,2M,3M,5M,6M")
    r = doc["replans"]
    assert r["count"] == 1 and doc["arenas"]["returned_at_retirement_bytes"] >= 3 << 20, (r, doc["arenas"])
    after = [s for s in doc["per_step"] if s["step"] == r["last_step"]]
    assert len(after) == 1 and after[0]["minor_faults"] < 128, (after, r)
    assert {c["size_bytes"] for c in doc["plan"]["classes"]} >= {1 << 20, 2 << 20, 3 << 20, 5 << 20, 6 << 20}


def test_a_job_alternating_phases_re_plans_a_bounded_number_of_times(prm, tmp_path):
    # A and B alternate every 30 steps for 1,200 steps, each plan profiled in one phase and blind to the other (and
    # its classes dropped by the decay while the other runs): every window of the drift check finds drift. Each
    # re-plan doubles the window (1, 2, 4, ... 256 steps), and the 8th is the last: later drifts are left alone,
    # counted. Every block kept across a phase change is intact when freed (the program checks it)
    doc = _drift_run(prm, tmp_path, 20, 30, 1)
    r = doc["replans"]
    assert r["count"] == 8 and r["window_steps"] == 2 ** 8 and r["held_at_limit"] >= 1, r
    assert doc["arenas"]["retired"] == 8 and doc["arenas"]["retired_bytes"] == 0
    assert not doc["errors"] and doc["state"] == "planned"


def test_a_steady_job_is_never_re_planned(prm, tmp_path):
    # the same sizes throughout; the 1 MiB block kept over the second half takes the plan's one 1 MiB block, so
    # the next step's 1 MiB finds its class exhausted (a class the plan has, no drift), and the class grows by that
    # request's block when it is freed: every later step's 1 MiB is the arena's
    doc = _drift_run(prm, tmp_path, 1, 40, 2, "1M,2M", "1M,2M")
    assert doc["replans"]["count"] == 0 and doc["replans"]["last_step"] is None
    assert doc["arenas"]["grown_blocks"] == 1 and doc["totals"]["arena_exhausted"] == 1
    assert doc["hit_rate_after_plan"] > 0.95
