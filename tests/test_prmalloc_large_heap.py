# test_prmalloc_large_heap.py -- the large heap and huge pages: its unit test, glibc's thread heaps, the launcher's tunables.
import pytest

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
