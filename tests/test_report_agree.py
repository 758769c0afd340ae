# test_report_agree.py -- the summary, `rtkit report`, the HTML and `rtkit compare` agree figure for figure on real runs.
"""For each API (Session, MonitoredTrainingSession, Keras fit) the bundled wdl workload runs under the real
`rtkit run`: by default, and in the other modes the API is crossed with (tier mode, --plan with the default
run's plan; the Session API in both, each mode with two APIs: the views render a mode's figures alike whatever
the API, so a third run of each mode adds no path). Every glossary figure a report has must read the same (name
and value text) in the summary the run printed, the terminal report, the HTML report and the compare of the
default run with each other run. Small step counts keep it affordable on 2 cores."""
import html as htmllib
import json
import os
import re

import pytest

from conftest import requires_tf, run_rtkit, wdl_run
from rtkit.report import glossary as G

pytestmark = [requires_tf, pytest.mark.timeout(900)]

APIS = ("session", "monitored", "keras")
MODES = {"session": ("tier", "plan"), "monitored": ("plan",), "keras": ("tier",)}   # besides the default run
SUMMARY_FIGURES = ("step_ms_median", "step_ms_p95", "steps_per_s", "peak_rss_bytes", "faults_per_step_median",
                   "epoch_s_median", "epoch_step_ms", "tier_bytes", "tier_peak_bytes", "dram_saved_bytes")


@pytest.fixture(scope="module", params=APIS)
def api_runs(request, tmp_path_factory, data_dir, wdl_default_runs):
    api = request.param
    base = tmp_path_factory.mktemp(f"agree-{api}")
    runs = {"default": wdl_default_runs(api)}   # (tests/conftest.py: test_hooks_tf.py counts its steps too)
    if "tier" in MODES[api]:
        runs["tier"] = wdl_run(base / "tier", data_dir, api, ["--set", f"tier_pool_path={base / 'pool'}"])
    if "plan" in MODES[api]:
        runs["plan"] = wdl_run(base / "plan", data_dir, api,
                               ["--plan", os.path.join(runs["default"]["dir"], "malloc-plan.txt")])
    return api, runs


def _present(report):
    return [(fid, G.FIGURES[fid]) for fid in G.FIGURES if G.value(report, fid) is not None]


def _terminal_has(text, name, value, wrapped=False):
    if wrapped:   # a long text value (a plan's path and reason) wraps, also inside words: compare without spaces
        return re.sub(r"\s", "", name + value) in re.sub(r"\s", "", text)
    # a label and its value on one line, or a long label on its own line and the value under it
    pat = re.compile(rf"^\s+{re.escape(name)}\s+{re.escape(value)}(\s|$)|^\s+{re.escape(name)}\n\s+{re.escape(value)}(\s|$)",
                     re.M)
    return bool(pat.search(text))


def test_every_view_names_each_figure_alike(api_runs):
    api, runs = api_runs
    for label, run in runs.items():
        rep = run["report"]
        text = run_rtkit(["report", run["dir"]], env={"COLUMNS": "200"}, check_rc=0).stdout
        with open(os.path.join(run["dir"], "report.html")) as fh:
            page = htmllib.unescape(fh.read())
        summary = "\n".join(run["summary"])
        for fid, f in _present(rep):
            name, value = f.name, f.text(f.read(rep))
            assert _terminal_has(text, name, value, f.unit == "text"), (api, label, fid, name, value)
            assert re.search(rf"<td[^>]*>{re.escape(name)}</td><td>{re.escape(value)}", page), (api, label, fid)
            if fid in SUMMARY_FIGURES:
                assert f"{name} {value}" in summary, (api, label, fid, summary)
        for key in ("faults_after_plan", "hit_rate_after_plan"):   # after-plan figures: only once a plan is in use
            if G.value(rep, "allocator_state") == "planned" and G.value(rep, key) is not None:
                assert f"{G.name(key)} {G.text(rep, key)}" in summary, (api, label, key)
        assert len(run["summary"]) <= 9, run["summary"]


def test_compare_shows_the_same_figures(api_runs):
    api, runs = api_runs
    a = runs["default"]
    for label in MODES[api]:
        b = runs[label]
        data = json.loads(run_rtkit(["compare", a["dir"], b["dir"], "--json"], check_rc=0).stdout)
        text = run_rtkit(["compare", a["dir"], b["dir"], "--width", "200"], check_rc=0).stdout
        rows = {m["key"]: m for m in data["metrics"]}
        for fid, f in _present(a["report"]) + _present(b["report"]):
            m = rows[fid]
            assert m["label"] == f.name
            assert m["a"] == f.read(a["report"]) and m["b"] == f.read(b["report"]), (api, label, fid)
            line = [l for l in text.splitlines() if l.startswith(f.name + " ")]
            assert line, (fid, text)
            if f.unit != "text":
                assert f.text(m["a"]) in line[0] and f.text(m["b"]) in line[0], (fid, line)
        # the differing setting comes before the figures
        key = "tier_pool_path" if label == "tier" else "malloc_plan"
        assert any(s["key"] == key for s in data["settings_differ"])
        assert text.index(f"  {key}:") < text.index("figures (")
        if label == "tier":
            assert any(c["component"] == "tier" for c in data["components_differ"])


def test_what_each_run_says_is_true(api_runs):
    api, runs = api_runs
    want_api = {"session": "Session.run", "monitored": "MonitoredTrainingSession", "keras": "Keras Model.fit"}[api]
    for label, run in runs.items():
        rep, summary = run["report"], "\n".join(run["summary"])
        assert want_api in rep["steps"]["api"] and want_api in summary
        assert want_api in rep["steps"]["hook"]["detail"]
        tier_line = [l for l in run["summary"] if l.startswith("rtkit: tier:")]
        if label == "tier":
            assert G.tier_on(rep) and tier_line and rep["pmem"]["tier_peak_bytes"] > 0
        else:
            assert not tier_line and not G.tier_on(rep)
            text = run_rtkit(["report", run["dir"]], check_rc=0).stdout
            assert "PMEM tier: off" in text and "tier bytes" not in text
        alloc_line = [l for l in run["summary"] if l.startswith("rtkit: allocator:")][0]
        if label == "plan" and rep["allocator"]["plan"]["source"] == "loaded":
            assert "plan loaded from" in alloc_line
        elif rep["allocator"]["plan"].get("rejected_reason"):
            assert "not used" in alloc_line
        elif rep["allocator"]["state"] == "planned":
            assert "plan profiled" in alloc_line
        with open(os.path.join(run["dir"], "report.html")) as fh:
            assert "(plotted" not in fh.read()
        if api == "keras":
            k = rep["steps"]["keras"]
            assert k["epochs"] >= 1 and k["train_batches"] == rep["steps"]["count"]
            assert [l for l in run["summary"] if l.startswith("rtkit: keras:")]
