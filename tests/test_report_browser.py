# test_report_browser.py -- report.html of a real run rendered in headless Chromium: plots drawn, no console errors.
import json
import re
import sys

import pytest

import browser
from conftest import requires_tf, run_rtkit
from tf_scripts import session_training

PY = sys.executable
PALETTE_BLUE, PALETTE_RED = "#1f77b4", "#d62728"   # the first two series colours of rtkit/report/svg.py

SCRIPT = session_training(width=256, batch=512, steps=40)


@pytest.fixture(scope="module")
def chromium():
    path, why = browser.find_or_install()
    if not path:
        pytest.skip(why)
    return path


@pytest.fixture(scope="module")
def html_report(tmp_path_factory):
    base = tmp_path_factory.mktemp("browser")
    script = base / "train.py"
    script.write_text(SCRIPT)
    run_dir = base / "run"
    run_rtkit(["run", "--html", "--quiet", "--run-dir", str(run_dir), "--", PY, str(script)], check_rc=0)
    return run_dir / "report.html"


@requires_tf
def test_report_renders_in_chromium_with_plots_and_no_console_errors(chromium, html_report, tmp_path):
    png = str(tmp_path / "report.png")
    # a window taller than the page: a plot below the window's bottom edge is not in the screenshot (the allocator's
    # plot sits near 4000 px once the report has its notes and other run signatures)
    dom, console = browser.render(chromium, html_report.as_uri(), png, height=9000)
    assert not console, console
    assert "(plotted" not in dom, "the HTML report must not point at itself"
    svgs = re.findall(r"<svg\b.*?</svg>", dom, re.S)
    titles = [t for s in svgs for t in re.findall(r'font-weight="bold"[^>]*>([^<]+)<', s)]
    for want in ("RSS over time", "Step time per step", "Minor page faults per step",
                 "Allocator: arena hits and fallbacks per step"):
        assert any(want in t for t in titles), (want, titles)
    # every plot has data marks: a line with points or bars
    for s in svgs:
        assert re.search(r'<polyline[^>]+points="[\d.]+,[\d.]+ [\d.]+,[\d.]+', s) or s.count("<rect") > 3, s[:300]
    # and Chromium drew them: the series colours cover real pixels of the screenshot
    _w, _h, rows = browser.read_png(png)
    assert browser.count_colour(rows, PALETTE_BLUE) > 2000
    # allocator fallbacks are drawn stacked on the hits, in red, in the steps that have both (the large-object
    # heap serves the sizes without a planned class, so a run may have no fallback once it has hits)
    report = json.loads((html_report.parent / "report.json").read_text())
    fallbacks = sum(s.get("fallbacks") or 0 for s in report["allocator"].get("per_step") or [] if s.get("arena_hits"))
    if fallbacks:
        assert browser.count_colour(rows, PALETTE_RED) > 50, fallbacks


@pytest.mark.slow
def test_console_errors_are_seen(chromium, tmp_path):
    """The check above can fail: a page that logs an error is caught."""
    page = tmp_path / "bad.html"
    page.write_text("<!DOCTYPE html><html><body><script>console.error('rtkit-probe')</script></body></html>")
    _dom, console = browser.render(chromium, page.as_uri(), str(tmp_path / "bad.png"), height=300)
    assert any("rtkit-probe" in line for line in console), console


@pytest.mark.slow
def test_png_reader_counts_colours(chromium, tmp_path):
    page = tmp_path / "c.html"
    page.write_text('<!DOCTYPE html><html><body style="margin:0;background:#fff">'
                    '<div style="width:100px;height:50px;background:#1f77b4"></div></body></html>')
    browser.render(chromium, page.as_uri(), str(tmp_path / "c.png"), width=400, height=300)
    _w, _h, rows = browser.read_png(str(tmp_path / "c.png"))
    assert 4500 <= browser.count_colour(rows, "#1f77b4", tolerance=2) <= 5500
    assert browser.count_colour(rows, "#d62728") == 0
