# test_prmalloc_glibc_api.py -- glibc's extra entry points (mallinfo, malloc_trim, nothrow new, page-aligned memalign) see rtkit's memory.
import pytest

from prmalloc_cases import case_ok, run_case
from test_prmalloc import FAST, run_c, stats

pytestmark = pytest.mark.timeout(300)


def test_alignment_above_a_page_is_served(prm, tmp_path):
    # posix_memalign(64K, 4M) each step: a class aligned to 4 KiB could never serve it
    case_ok(run_case(prm, "big_align", tmp_path), "big_align")
    doc = stats(tmp_path)
    assert doc["hit_rate_after_plan"] == 1.0


def test_mallinfo_malloc_info_mallopt_see_rtkit_memory(prm, tmp_path):
    case_ok(run_case(prm, "mallinfo", tmp_path), "mallinfo")


def test_malloc_trim_releases_idle_rtkit_pages(prm, tmp_path):
    case_ok(run_case(prm, "trim", tmp_path), "trim")


def test_nothrow_new_runs_the_new_handler(prm, tmp_path):
    proc = run_c(prm, "prmalloc_cxx_nothrow", extra={**FAST, "RTKIT_RUN_DIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "prmalloc_cxx_nothrow: ok\n"
