# test_prmalloc_large_heap.py -- the large heap and huge pages: its unit test, glibc's thread heaps, the launcher's tunables.
import sys

import pytest

from conftest import load_report, run_rtkit
from prmalloc_cases import case_ok, run_case
from test_prmalloc import run_c

pytestmark = pytest.mark.timeout(300)


def test_unit_large_heap(prm):
    # the retained large-object heap alone: threads, coalescing, double/interior free refused, resize, decay, trim,
    # a smaller range when the first is refused. LARGE=0: the engine's own start-up must not set the heap up first.
    proc = run_c(prm, "prmalloc_unit_large", preload=False, extra={"RTKIT_MALLOC_LARGE": "0"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "prmalloc_unit_large: ok\n"


def test_glibc_thread_heaps_get_huge_pages(prm, tmp_path):
    # with the large heap on, glibc keeps only small objects; their thread heaps grow into fresh 4 KiB pages
    # every step unless advised for huge pages: each is advised, writable whole
    case_ok(run_case(prm, "glibc_thp", tmp_path), "glibc_thp")
    # huge pages off, or the user's own glibc.malloc.hugetlb choice: glibc's heaps are left alone
    off = run_case(prm, "glibc_thp", tmp_path / "a", {"RTKIT_MALLOC_THP": "0"})
    assert "not advised for huge pages" in off.stdout and "not writable whole" in off.stdout
    mine = run_case(prm, "glibc_thp", tmp_path / "b", {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"})
    assert "not advised for huge pages" in mine.stdout


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


# a job whose large heap is mostly one long-lived block (an embedding table: 768 MiB, never touched here) and whose
# steps churn one recurring 1 MiB buffer: the headroom faulted in after the plan follows the heap's churn, not its
# size (1/32 of the heap in use kept 24 MiB idle; wdl ran with the same faults after the plan on 1/4 of it)
HEADROOM_SCRIPT = """
import rtkit
table = bytearray(768 << 20)
for i in range(12):
    buf = bytearray(1 << 20)
    buf[::4096] = b"x" * 256
    del buf
    rtkit.step()
"""


def test_headroom_after_the_plan_is_not_sized_by_long_lived_blocks(tmp_path):
    d = str(tmp_path / "run")
    run_rtkit(["run", "--run-dir", d, "--", sys.executable, "-c", HEADROOM_SCRIPT], check_rc=0, timeout=240)
    a = load_report(d)["allocator"]
    assert a["state"] == "planned", a["state"]
    heap = a["large_heap"]
    assert heap["used_bytes"] >= 768 << 20  # the table is the large heap's
    assert heap["prefaulted_bytes"] <= 8 << 20, heap  # 1/128 of it (6 MiB), where 1/32 took 24 MiB
