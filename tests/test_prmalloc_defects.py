# test_prmalloc_defects.py -- PRMalloc's plan, arena and free-path invariants, one reproducer each (prmalloc_defects.c).
import os
import re
import signal
import struct

import pytest

from test_prmalloc import FAST, run_c, stats

pytestmark = pytest.mark.timeout(300)


def _defect(prm, case, tmp_path, extra=None):
    return run_c(prm, "prmalloc_defects", args=[case], extra={**FAST, "RTKIT_RUN_DIR": str(tmp_path), **(extra or {})})


def _ok(proc, case):
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout == f"prmalloc_defects {case}: ok\n"


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
    # was malloc + copy + free per call once planned: 1.05M faults where glibc takes ~1k
    _ok(_defect(prm, "realloc_cliff", tmp_path), "realloc_cliff")


@pytest.mark.parametrize("case,word", [("double_free", "double free"), ("interior_free", "invalid pointer")])
@pytest.mark.parametrize("debug", ["0", "1"])
def test_bad_free_aborts_with_one_line(prm, tmp_path, case, word, debug):
    # a double free handed the block to the next two mallocs; an interior free leaked the block silently
    proc = _defect(prm, case, tmp_path, {"RTKIT_MALLOC_DEBUG": debug})
    assert proc.returncode == -signal.SIGABRT, proc.stdout + proc.stderr
    assert "survived" not in proc.stdout
    lines = [ln for ln in proc.stderr.splitlines() if word in ln]
    assert len(lines) == 1 and re.search(r"0x[0-9a-f]+", lines[0]), proc.stderr


def test_alignment_above_a_page_is_served(prm, tmp_path):
    # posix_memalign(64K, 4M) each step got a class aligned to 4 KiB that could never serve it
    _ok(_defect(prm, "big_align", tmp_path), "big_align")
    doc = stats(tmp_path)
    assert doc["hit_rate_after_plan"] == 1.0


def test_rejected_plan_arena_is_released(prm, tmp_path):
    # a rejected loaded plan of 256 MiB kept RssAnon at ~265 MB
    plan = tmp_path / "big-plan.txt"
    plan.write_text(plan_text([(64 << 20, 4, 4096)]))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    proc = run_c(prm, "prmalloc_defects", args=["retired_rss"],
                 extra={**FAST, "RTKIT_MALLOC_PROFILE_START": "1", "RTKIT_RUN_DIR": str(run_dir),
                        "RTKIT_MALLOC_PLAN": str(plan)})
    _ok(proc, "retired_rss")
    assert "does not match" in stats(run_dir)["plan"]["rejected_reason"]


def test_sizes_drifting_after_the_plan_are_served(prm, tmp_path):
    # a profiled plan was never re-checked, and only one arena could ever be retired
    _ok(_defect(prm, "drift", tmp_path), "drift")


def test_cfree_is_interposed(prm, tmp_path):
    _ok(_defect(prm, "cfree", tmp_path), "cfree")


def test_mallinfo_malloc_info_mallopt_see_rtkit_memory(prm, tmp_path):
    _ok(_defect(prm, "mallinfo", tmp_path), "mallinfo")


def test_malloc_trim_releases_idle_rtkit_pages(prm, tmp_path):
    _ok(_defect(prm, "trim", tmp_path), "trim")


def test_free_sized_and_free_aligned_sized(prm, tmp_path):
    _ok(_defect(prm, "free_sized", tmp_path), "free_sized")


def test_nothrow_new_runs_the_new_handler(prm, tmp_path):
    proc = run_c(prm, "prmalloc_cxx_nothrow", extra={**FAST, "RTKIT_RUN_DIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "prmalloc_cxx_nothrow: ok\n"


def test_profiler_overflow_is_counted(prm, tmp_path):
    proc = _defect(prm, "profiler_overflow", tmp_path, {"RTKIT_MALLOC_MIN_SIZE": "64"})
    _ok(proc, "profiler_overflow")
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


def test_own_plan_accepted_when_blocks_are_held_before_the_first_step(prm, tmp_path):
    # the blocks a job takes before its first step stay live: validation in steps 2..4 found no free block
    # and rejected the job's own plan ("arenas served 0 of 42 allocations >= min_size in steps 2..4")
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    _ok(run_c(prm, "prmalloc_defects", args=["held_before_steps"], extra={"RTKIT_RUN_DIR": str(first)}),
        "held_before_steps")
    plan = first / "malloc-plan.txt"
    assert plan.exists()
    proc = run_c(prm, "prmalloc_defects", args=["held_before_steps"],
                 extra={"RTKIT_RUN_DIR": str(second), "RTKIT_MALLOC_PLAN": str(plan)})
    _ok(proc, "held_before_steps")
    doc = stats(second)
    assert doc["plan"]["source"] == "loaded" and doc["plan"]["rejected_reason"] is None, doc["plan"]
    assert doc["profile"]["profiled_steps"] == 0


def test_unit_large_heap(prm):
    # the retained large-object heap alone: threads, coalescing, double/interior free refused, resize, decay, trim,
    # a smaller range when the first is refused. LARGE=0: the engine's own start-up must not set the heap up first.
    proc = run_c(prm, "prmalloc_unit_large", preload=False, extra={"RTKIT_MALLOC_LARGE": "0"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "prmalloc_unit_large: ok\n"


def test_debug_mode_reports_a_write_after_free(prm, tmp_path):
    # debug mode keeps deeper checks than the always-on ones: freed blocks are poisoned and checked on reuse
    proc = _defect(prm, "write_after_free", tmp_path, {"RTKIT_MALLOC_DEBUG": "1"})
    _ok(proc, "write_after_free")
    assert re.search(r"block 0x[0-9a-f]+ was written after it was freed", proc.stderr), proc.stderr
    assert stats(tmp_path)["totals"]["debug_errors"] == 1
    quiet = _defect(prm, "write_after_free", tmp_path / "off") if (tmp_path / "off").mkdir() is None else None
    assert "written after" not in quiet.stderr


def test_glibc_thread_heaps_get_huge_pages(prm, tmp_path):
    # with the large heap on, glibc keeps only small objects; their thread heaps grew into fresh 4 KiB pages
    # every step (~40 faults/step on wdl 2048 after the plan): each is now advised for huge pages, writable whole
    _ok(_defect(prm, "glibc_thp", tmp_path), "glibc_thp")
    # huge pages off, or the user's own glibc.malloc.hugetlb choice: glibc's heaps are left alone
    off = _defect(prm, "glibc_thp", tmp_path / "a", {"RTKIT_MALLOC_THP": "0"})
    assert "not advised for huge pages" in off.stdout and "not writable whole" in off.stdout
    mine = _defect(prm, "glibc_thp", tmp_path / "b", {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"})
    assert "not advised for huge pages" in mine.stdout


def test_plan_classes_reuse_the_large_heaps_resident_pages(prm, tmp_path):
    # the classes hold the heap's own blocks, so installing a plan makes nothing new resident: a fresh span beside
    # the heap's scattered idle pages would double the memory the planned sizes take
    _ok(_defect(prm, "plan_reuse", tmp_path, {"RTKIT_MALLOC_PROFILE_START": "3"}), "plan_reuse")
    assert stats(tmp_path)["arenas"]["live_bytes"] + stats(tmp_path)["arenas"]["free_bytes"] >= 20 << 20


def test_launcher_asks_glibc_for_huge_pages(malloc_lib):
    # the small objects that stay with glibc grow its heap every step (new ids): huge pages fault 512x less
    from rtkit import config as cfg
    from rtkit.launch import build_child_env
    env = build_child_env(cfg.resolve(env={}), "/tmp/x", {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, [])
    assert env["LD_PRELOAD"].split()[-1] == malloc_lib
    assert env["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"
    env = build_child_env(cfg.resolve(env={}), "/tmp/x", {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, [])
    assert env["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=0"  # the user's choice stands
    env = build_child_env(cfg.resolve(cli={"malloc_thp": "0"}, env={}), "/tmp/x", {}, [])
    assert "GLIBC_TUNABLES" not in env
