# test_settings_limits.py -- Python and C read a setting's limits alike, and a value out of range falls back naming its source.
import sys

import pytest

from conftest import load_report, run_rtkit
from prmalloc_steps import alloc_docs, run_steps

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize("value", ["99999999999G", "18446744073709551616", "18446744073709551615", "16", "15", "64K",
                                   "\u0661\u0662K", "64\u2003K"])
def test_python_and_c_agree_on_size_limits(prm, tmp_path, value):
    from rtkit import config as cfg
    try:
        cfg.BY_KEY["malloc_min_size"].parse(value)
        python_ok = True
    except ValueError:
        python_ok = False
    proc = run_steps(prm, tmp_path, {"RTKIT_MALLOC_MIN_SIZE": value})
    assert proc.returncode == 0
    (doc,) = alloc_docs(tmp_path)
    c_ok = not any("RTKIT_MALLOC_MIN_SIZE" in e for e in doc["errors"])
    assert python_ok == c_ok and doc["state"] != "disabled"


def test_out_of_range_set_falls_back_with_its_source(tmp_path):
    run_dir = tmp_path / "r"
    proc = run_rtkit(["run", "--run-dir", str(run_dir), "--set", "malloc_min_size=99999999999G", "--",
                      sys.executable, "-c", "pass"], timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("rtkit: --set RTKIT_MALLOC_MIN_SIZE")]
    assert len(lines) == 1 and "--set" in lines[0] and "environment" not in proc.stderr, proc.stderr
    report = load_report(run_dir)
    assert any("99999999999G" in n for n in report["notes"])
    assert report["run"]["settings"]["malloc_min_size"]["value"] == 32 * 1024
    prof = tmp_path / "p.toml"
    prof.write_text('[settings]\nmalloc_min_size = "99999999999G"\n')
    proc = run_rtkit(["config", "--profile", str(prof)])
    assert proc.returncode == 0 and "profile" in proc.stderr and "p.toml" in proc.stderr
