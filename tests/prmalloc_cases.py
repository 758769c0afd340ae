# prmalloc_cases.py -- runs one case of the prmalloc_defects C program (allocators/tests/prmalloc_defects.c) for the prmalloc tests.
from test_prmalloc import FAST, run_c


def run_case(prm, case, tmp_path, extra=None):
    return run_c(prm, "prmalloc_defects", args=[case], extra={**FAST, "RTKIT_RUN_DIR": str(tmp_path), **(extra or {})})


def case_ok(proc, case):
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout == f"prmalloc_defects {case}: ok\n"
