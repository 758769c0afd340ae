# test_prmalloc_free.py -- the free path: a bad free aborts with one line, a write after free is reported, every free entry point is interposed.
import re
import signal

import pytest

from prmalloc_cases import case_ok, run_case
from test_prmalloc import stats

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize("case,word", [("double_free", "double free"), ("interior_free", "invalid pointer")])
@pytest.mark.parametrize("debug", ["0", "1"])
def test_bad_free_aborts_with_one_line(prm, tmp_path, case, word, debug):
    # unchecked, a double free hands the block to the next two mallocs and an interior free leaks it silently
    proc = run_case(prm, case, tmp_path, {"RTKIT_MALLOC_DEBUG": debug})
    assert proc.returncode == -signal.SIGABRT, proc.stdout + proc.stderr
    assert "survived" not in proc.stdout
    lines = [ln for ln in proc.stderr.splitlines() if word in ln]
    assert len(lines) == 1 and re.search(r"0x[0-9a-f]+", lines[0]), proc.stderr


def test_cfree_is_interposed(prm, tmp_path):
    case_ok(run_case(prm, "cfree", tmp_path), "cfree")


def test_free_sized_and_free_aligned_sized(prm, tmp_path):
    case_ok(run_case(prm, "free_sized", tmp_path), "free_sized")


def test_debug_mode_reports_a_write_after_free(prm, tmp_path):
    # debug mode keeps deeper checks than the always-on ones: freed blocks are poisoned and checked on reuse
    proc = run_case(prm, "write_after_free", tmp_path, {"RTKIT_MALLOC_DEBUG": "1"})
    case_ok(proc, "write_after_free")
    assert re.search(r"block 0x[0-9a-f]+ was written after it was freed", proc.stderr), proc.stderr
    assert stats(tmp_path)["totals"]["debug_errors"] == 1
    quiet = run_case(prm, "write_after_free", tmp_path / "off") if (tmp_path / "off").mkdir() is None else None
    assert "written after" not in quiet.stderr
