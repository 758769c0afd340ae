# test_report_vocab.py -- the glossary in docs/report.md is rtkit/report/glossary.py's, and each figure has one name.
import os

from rtkit.report import glossary as G

DOC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "report.md")


def test_docs_glossary_is_the_code_glossary():
    with open(DOC) as fh:
        text = fh.read()
    missing = [line for line in G.glossary_lines() if line not in text]
    assert not missing, "docs/report.md's glossary is out of date (regenerate from glossary_lines()):\n" + \
        "\n".join(missing)


def test_one_name_per_figure_and_each_says_its_statistic():
    names = [f.name for f in G.FIGURES.values()]
    assert len(names) == len(set(names))
    for f in G.FIGURES.values():
        if f.unit in ("ms", "count", "per_s") and "step" in f.name and f.id not in ("steps", "measured_steps",
                                                                                   "pipelined_steps"):
            # a per-step figure names its statistic (median, mean, percentile) or how it is derived
            assert any(w in f.name for w in ("median", "mean", "p5", "p95", "per train batch", "/ steps")), f.name
