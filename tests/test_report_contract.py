# test_report_contract.py -- reports written by the real C library and the real scheduler carry report/contract.py's keys, rendered with values.
import re
import sys

import pytest

from conftest import load_report, requires_tf, run_rtkit
from tf_scripts import session_training
from rtkit.report import contract, summary, terminal
from rtkit.report import html as html_mod
from rtkit.report import sections as sec

PY = sys.executable

# A plain Python job with a steady large-allocation pattern and marked steps: the allocator profiles, plans
# and serves from its arena; with tier_pool_path set, the tier places the long-lived buffers made before step 1.
ALLOC_SCRIPT = """
import rtkit
keep = [bytearray(4 << 20) for _ in range(4)]      # long-lived, made before the first step
for i in range(40):
    batch = [bytearray((256 + 64 * (k % 4)) << 10) for k in range(12)]
    del batch
    rtkit.step()
"""

SCHED_SCRIPT = session_training(width=64, batch=64, steps=40)


@pytest.fixture(scope="module")
def alloc_report(tmp_path_factory):
    base = tmp_path_factory.mktemp("contract")
    run_dir = base / "alloc"
    run_rtkit(["run", "--quiet", "--run-dir", str(run_dir), "--set", f"tier_pool_path={base / 'pool'}",
               "--set", "tier_min_size=1M", "--", PY, "-c", ALLOC_SCRIPT], timeout=180, check_rc=0)
    return load_report(run_dir)


def _row(section, name):
    found = [v for k, v in section.rows if k.strip() == name]
    assert found, f"no row '{name}' in {section.title}: {section.rows}"
    return found[0]


def test_the_c_library_writes_the_contracts_keys(alloc_report):
    for name in ("run", "process", "steps", "allocator", "pmem"):
        assert isinstance(alloc_report[name], dict), name
        assert contract.missing(name, alloc_report[name]) == [], name
    alloc = alloc_report["allocator"]
    assert alloc["state"] == "planned", alloc.get("plan")
    assert alloc_report["pmem"]["state"] == "on", alloc_report["pmem"]
    assert alloc_report["steps"]["count"] == 40


def test_the_allocator_echoes_the_settings_under_the_tables_keys(alloc_report):
    echo = contract.settings_echo(alloc_report["allocator"])
    settings = alloc_report["run"]["settings"]
    for key in ("malloc_min_size", "malloc_arena_limit", "malloc_profile_start", "malloc_thp"):
        assert key in echo, sorted(echo)
        assert echo[key] == settings[key]["value"], key


def _keys(d, path=""):
    """Every key of a nested JSON object, as dotted paths (list items under `[]`)."""
    items = d.items() if isinstance(d, dict) else (("[]", x) for x in d) if isinstance(d, list) else ()
    for k, v in items:
        yield f"{path}{k}"
        yield from _keys(v, f"{path}{k}.")


def test_the_tier_names_its_figures_for_what_they_hold(alloc_report):
    """pmem-<pid>.json echoes each setting it read under the settings table's key with the value rtkit resolved,
    names the pool file's geometry as the pool's own statistics do, and no key the C library writes, in either
    of its files, is a setting's old name."""
    from rtkit import config
    from rtkit.allocators import pmem as pm

    tier, settings = alloc_report["pmem"], alloc_report["run"]["settings"]
    for key in contract.Pmem.SETTINGS_ECHO:
        assert key in config.BY_KEY and tier.get(key) == settings[key]["value"], (key, tier.get(key))
    with pm.Pool.anonymous(8 << 20) as pool:   # the tier's pool is made with the pool's default geometry
        own = pool.stats()
    for path in contract.Pmem.POOL_GEOMETRY:
        key = path.split(".", 1)[1]
        assert tier["pool"].get(key) == own[key], (path, tier["pool"])
    for section in ("allocator", "pmem"):
        old = [k for k in _keys(alloc_report[section]) if k.rsplit(".", 1)[-1] in config.BY_ALIAS]
        assert old == [], (section, old)


def test_the_real_reports_render_with_values(alloc_report):
    sections = {s.key: s for s in sec.build_sections(alloc_report)}
    for s in sections.values():
        assert not [n for n in s.notes if "report contract" in n or "the allocator read" in n], (s.key, s.notes)
    a = sections["allocator"]
    assert re.match(r"\d+(\.\d+)?%$", _row(a, "arena hit rate (whole run)")), _row(a, "arena hit rate (whole run)")
    assert re.match(r"[\d,]+$", _row(a, "arena hits (whole run)")) and re.match(r"[\d,]+$", _row(a, "fallbacks (whole run)"))
    assert int(_row(a, "arena hits (whole run)").replace(",", "")) > 0
    assert re.match(r"\d+ classes, \d+ blocks", _row(a, "plan classes"))
    assert _row(a, "arena bytes reserved").endswith(("KiB", "MiB", "GiB"))
    assert _row(a, "mean minor faults/step before plan (step to step)") != "-"
    p = sections["pmem"]
    assert _row(p, "state") == "on" and _row(p, "tier bytes held (peak)").endswith(("KiB", "MiB", "GiB"))
    text = terminal.render(alloc_report)
    assert "report contract" not in text
    assert any(l.startswith("rtkit: allocator: planned, plan profiled") for l in summary.lines(alloc_report))
    page = html_mod.render(alloc_report)
    assert "Allocator: arena hits and fallbacks per step" in page


def test_a_renamed_key_is_a_visible_note(alloc_report):
    import copy

    rep = copy.deepcopy(alloc_report)
    rep["allocator"]["totals"]["hits_renamed"] = rep["allocator"]["totals"].pop("arena_hits")
    a = next(s for s in sec.build_sections(rep) if s.key == "allocator")
    assert any("report contract" in n and "totals.arena_hits" in n for n in a.notes), a.notes
    assert "totals.arena_hits" in terminal.render(rep)


@requires_tf
def test_the_scheduler_writes_the_contracts_keys(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCHED_SCRIPT)
    run_dir = tmp_path / "sched"
    run_rtkit(["run", "--quiet", "--run-dir", str(run_dir), "--set", "malloc=0", "--set", "sched=1",
               "--set", "sched_tune=1", "--set", "sched_tune_steps=12", "--", PY, str(script)],
              timeout=300, check_rc=0)
    rep = load_report(run_dir)
    sched = rep["scheduler"]
    assert isinstance(sched, dict)
    assert contract.missing("scheduler", sched) == []
    assert sched["tuning"]["done"], sched["tuning"]
    s = next(x for x in sec.build_sections(rep) if x.key == "scheduler")
    assert not [n for n in s.notes if "report contract" in n], s.notes
    assert "compute_threads=" in _row(s, "scheduler configuration")
    assert re.match(r"\d+ \(\d+ steps used\)", _row(s, "tuning trials"))
    assert re.match(r"-?[\d.]+%$", _row(s, "tuning gain"))
    assert any(t.title == "stages" for t in s.tables) and any(t.title == "tuning trials" for t in s.tables)
    assert any(l.startswith("rtkit: scheduler: applied compute_threads=") for l in summary.lines(rep))
