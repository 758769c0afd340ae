# test_asan.py -- every C test program that links the libraries' sources runs once under AddressSanitizer.
import glob
import os
import subprocess

import pytest

from conftest import REPO, preload_env
from rtkit import config
from test_prmalloc_plan import plan_text

pytestmark = pytest.mark.timeout(600)

TESTS = os.path.join(REPO, "allocators", "tests")
ASAN = {"ASAN_OPTIONS": "detect_leaks=0", "RTKIT_MALLOC_PROFILE_START": "0"}

# program -> (arguments, settings, the line it ends with when it passed). A program linking the sources that is
# missing here fails test_every_program_linking_the_sources_has_an_asan_run.
RUNS = {
    "prmalloc_unit_large": ([], {"RTKIT_MALLOC_LARGE": "0"}, "prmalloc_unit_large: ok"),
    "prmalloc_unit_owner": ([], {"RTKIT_MALLOC_LARGE": "0"}, "prmalloc_unit_owner: ok"),
    "prmalloc_unit_plan": ([], {}, "prmalloc_unit_plan: ok"),
    "prmalloc_unit_min_size": (["{min_size}", str(1 << 20)], {"RTKIT_MALLOC_PLAN": "{plan}"},
                               "prmalloc_unit_min_size: ok"),
    "prmalloc_unit_tier": ([], {"RTKIT_TIER_POOL_PATH": "{tmp}/pool", "RTKIT_RUN_DIR": "{tmp}"},
                           "prmalloc_unit_tier: ok"),
    "pmem_basic": ([], {}, "pmem_basic: ok"),
    "pmem_stress": ([], {}, "pmem_stress: ok"),
    "pmem_crash": (["20"], {}, "ok"),
}
# run under ASan by the tests of their own cases
ELSEWHERE = {"prmalloc_unit_stress": "test_prmalloc.py::test_unit_stress_under_asan",
             "prmalloc_unit_peer_cases": "test_prmalloc_peer_cases.py::test_peer_cases_under_asan"}


def _linking_the_sources():
    """The test programs whose build rule compiles the library sources in (the rest run under LD_PRELOAD, which
    cannot take malloc from the sanitizer's interceptors)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("_rtkit_build", os.path.join(REPO, "allocators", "build.py"))
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    names = sorted(os.path.splitext(os.path.basename(p))[0] for p in glob.glob(os.path.join(TESTS, "*.c*")))
    return [n for n in names if build._rule_for(n) and build._rule_for(n)[0]]


def test_every_program_linking_the_sources_has_an_asan_run():
    programs = _linking_the_sources()
    assert "prmalloc_unit_owner" in programs and "pmem_basic" in programs, programs
    missing = set(programs) - set(RUNS) - set(ELSEWHERE)
    assert not missing, f"add an ASan run for {sorted(missing)} to RUNS"


@pytest.mark.slow  # the ASan builds
@pytest.mark.parametrize("program", sorted(RUNS))
def test_program_under_asan(request, tmp_path, program):
    native = request.getfixturevalue("pmem_asan" if program.startswith("pmem_") else "prm_asan")
    args, extra, last = RUNS[program]
    plan = tmp_path / "plan.txt"
    plan.write_text(plan_text([(1 << 20, 1, 4096), (2 << 20, 1, 4096)], min_size=1 << 20))
    extra = {k: v.format(plan=plan, tmp=tmp_path) for k, v in extra.items()}
    args = [a.format(min_size=config.BY_KEY["malloc_min_size"].default) for a in args]
    proc = subprocess.run([os.path.join(native, "tests", program), *args], cwd=tmp_path, capture_output=True,
                          text=True, env=preload_env(native, {**ASAN, **extra}, preload=False), timeout=500)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    assert "AddressSanitizer" not in proc.stderr, proc.stderr[-4000:]
    ends = [text.strip().splitlines()[-1] for text in (proc.stdout, proc.stderr) if text.strip()]
    assert any(end.endswith(last) for end in ends), proc.stdout + proc.stderr[-2000:]
