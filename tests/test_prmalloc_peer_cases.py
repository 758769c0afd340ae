# test_prmalloc_peer_cases.py -- the kinds of cases the peers' own suites check, under the preload, with and without step marks.
import os
import re
import signal
import subprocess
import sys

import pytest

from test_prmalloc import FAST, _env, run_c, stats
from test_prmalloc_plan import plan_text

pytestmark = pytest.mark.timeout(300)

# A hang detector only (these cases finish in seconds): a case still running after it has hung.
HANG_S = 60
MODES = ["plain", "marks"]


def _case(prm, case, tmp_path, mode, extra=None):
    args = [case] + (["marks"] if mode == "marks" else [])
    env = {**FAST, "RTKIT_RUN_DIR": str(tmp_path), **(extra or {})}
    try:
        return run_c(prm, "prmalloc_peer_cases", args=args, extra=env, timeout=HANG_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"prmalloc_peer_cases {case} {mode} hung (still running after {HANG_S} s)", pytrace=False)


def _ok(proc, case):
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert proc.stdout == f"prmalloc_peer_cases {case}: ok\n"


def _aborted(proc, word):
    assert proc.returncode == -signal.SIGABRT, proc.stdout + proc.stderr
    assert "survived" not in proc.stdout
    lines = [ln for ln in proc.stderr.splitlines() if word in ln]
    assert len(lines) == 1 and re.search(r"0x[0-9a-f]+", lines[0]), proc.stderr


# ---- alignment and errno


@pytest.mark.parametrize("mode", MODES)
def test_huge_alignment_is_enomem_never_a_live_block(prm, tmp_path, mode):
    # alignments of 2^44 and more came back as an existing live block (the alignment lost in a 32-bit field)
    _ok(_case(prm, "huge_align", tmp_path, mode), "huge_align")


@pytest.mark.parametrize("mode", MODES)
def test_too_large_requests_set_glibcs_errno(prm, tmp_path, mode):
    # memalign(2^63, n) set EINVAL where glibc sets ENOMEM
    _ok(_case(prm, "too_large", tmp_path, mode), "too_large")


# ---- fork


@pytest.mark.parametrize("mode", MODES)
def test_fork_from_a_signal_handler_inside_malloc(prm, tmp_path, mode):
    # fork's prepare handler spun forever on the large heap's lock the interrupted malloc held
    _ok(_case(prm, "fork_signal", tmp_path, mode), "fork_signal")


@pytest.mark.parametrize("mode", MODES)
def test_fork_beside_stdio_and_realloc(prm, tmp_path, mode):
    # rtkit's fork handlers took its locks before glibc's stream list lock, while getdelim's realloc held a FILE lock
    _ok(_case(prm, "fork_stdio", tmp_path, mode), "fork_stdio")


# ---- limits


@pytest.mark.parametrize("mode", MODES)
def test_threads_start_after_rlimit_as_is_lowered(prm, tmp_path, mode):
    # the 64 GiB reservation made at start already exceeded a 4 GiB RLIMIT_AS set later: no thread could start
    _ok(_case(prm, "rlimit_threads", tmp_path, mode), "rlimit_threads")


@pytest.mark.parametrize("mode", MODES)
def test_threads_start_after_rlimit_as_is_lowered_to_200_mib(prm, tmp_path, mode):
    # glibc's tst-malloc-thread-fail (200 MiB): the page map and first piece mapped at start took 512 MiB
    _ok(_case(prm, "rlimit_200m", tmp_path, mode), "rlimit_200m")


@pytest.mark.parametrize("mode", MODES)
def test_large_heap_grows_past_its_first_piece(prm, tmp_path, mode):
    _ok(_case(prm, "heap_growth", tmp_path, mode), "heap_growth")


def test_python_starts_threads_under_a_run_time_rlimit_as(prm, tmp_path):
    # CPython: "can't start new thread" under an 8 GiB RLIMIT_AS set at run time, fine under glibc
    code = ("import resource, threading\n"
            "soft, hard = resource.getrlimit(resource.RLIMIT_AS)\n"
            "resource.setrlimit(resource.RLIMIT_AS, (8 << 30, hard))\n"
            "out = []\n"
            "ts = [threading.Thread(target=lambda: out.append(len(bytearray(1 << 20)))) for _ in range(20)]\n"
            "[t.start() for t in ts]\n"
            "[t.join() for t in ts]\n"
            "print('threads', len(out), len(bytearray(256 << 20)))\n")
    env = _env(prm, {"RTKIT_RUN_DIR": str(tmp_path)})
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=HANG_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout == f"threads 20 {256 << 20}\n"


def test_plan_file_footprint_counts_a_page_per_block(prm, tmp_path):
    # `class 64 262144 64` counted as 16 MiB against a 32 MiB limit; its blocks took a page each: 1 GiB of RSS
    plan = tmp_path / "plan.txt"
    plan.write_text(plan_text([(64, 262144, 64)]))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    proc = _case(prm, "plan_footprint", run_dir, "marks",
                 {"RTKIT_MALLOC_PLAN": str(plan), "RTKIT_MALLOC_ARENA_LIMIT": "32M"})
    _ok(proc, "plan_footprint")
    lines = [ln for ln in proc.stderr.splitlines() if "RTKIT_MALLOC" in ln]
    assert len(lines) == 1 and "RTKIT_MALLOC_ARENA_LIMIT" in lines[0], proc.stderr
    assert stats(run_dir)["plan"]["source"] != "loaded"


# ---- the debug check on a correct program


@pytest.mark.parametrize("mode", MODES)
def test_debug_finds_no_write_after_free_in_a_correct_program(prm, tmp_path, mode):
    # stale poison survived extent merges in the large heap: "written after it was freed" on correct programs
    proc = _case(prm, "debug_churn", tmp_path, mode, {"RTKIT_MALLOC_DEBUG": "1"})
    _ok(proc, "debug_churn")
    assert "written after it was freed" not in proc.stderr, proc.stderr[-3000:]
    assert stats(tmp_path)["totals"]["debug_errors"] == 0


# ---- bad pointers into rtkit's memory


def test_realloc_of_a_freed_block_aborts(prm, tmp_path):
    # realloc returned the freed planned block, and the next malloc returned it again
    _aborted(_case(prm, "realloc_freed", tmp_path, "marks"), "invalid pointer")


def test_usable_size_of_a_freed_block_is_zero(prm, tmp_path):
    # malloc_usable_size of a freed arena block returned its class size
    _ok(_case(prm, "usable_freed", tmp_path, "marks"), "usable_freed")


def test_double_free_of_a_kept_fallback_block_aborts(prm, tmp_path):
    # RTKIT_MALLOC_LARGE=0: the stash kept a block freed twice and handed it out twice
    _aborted(_case(prm, "stash_double_free", tmp_path, "marks", {"RTKIT_MALLOC_LARGE": "0"}), "double free")


# ---- once under AddressSanitizer: a preload cannot take malloc from the sanitizer's interceptors, so the same
# cases are linked against the allocator's sources (prmalloc_unit_peer_cases). Left out there: the cases whose
# fallback is the sanitizer's own allocator in that build (huge alignments and too-large requests trip its internal
# checks), the one on glibc's stdio locks (stdio allocates from the sanitizer), and RLIMIT_AS (its shadow memory
# alone exceeds any such limit).
ASAN_CASES = ["fork_signal", "heap_growth", "debug_churn", "usable_freed"]


@pytest.mark.slow  # the ASan build
def test_peer_cases_under_asan(prm_asan, tmp_path):
    exe = os.path.join(prm_asan, "tests", "prmalloc_unit_peer_cases")
    for case in ASAN_CASES:
        for mode in MODES:
            env = _env(prm_asan, {**FAST, "ASAN_OPTIONS": "detect_leaks=0", "RTKIT_RUN_DIR": str(tmp_path),
                                  "RTKIT_MALLOC_DEBUG": "1" if case == "debug_churn" else "0"}, preload=False)
            args = [exe, case] + (["marks"] if mode == "marks" else [])
            proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=HANG_S * 2)
            assert proc.returncode == 0, (case, mode, proc.stderr[-3000:])
            assert proc.stdout == f"prmalloc_peer_cases {case}: ok\n", (case, mode, proc.stdout)
            assert "written after it was freed" not in proc.stderr
    proc = subprocess.run([exe, "realloc_freed"], env=_env(prm_asan, {**FAST, "ASAN_OPTIONS": "detect_leaks=0"},
                                                            preload=False),
                          capture_output=True, text=True, timeout=HANG_S * 2)
    _aborted(proc, "invalid pointer")
