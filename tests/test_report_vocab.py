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


def test_each_per_step_fault_figure_names_its_span():
    # two per-step fault figures measure different spans (the hooks' window inside a step; the allocator's step
    # mark to the next, what runs between steps included) and stand on one summary line: each says which
    spans = {"(in step)": "inside the step", "(step to step)": "from one step mark to the next"}
    faulty = [f for f in G.FIGURES.values() if "faults/step" in f.name]
    assert len(faulty) >= 3
    for f in faulty:
        span = [s for s in spans if f.name.endswith(s)]
        assert len(span) == 1, f.name
        assert spans[span[0]] in f.meaning, (f.name, f.meaning)
    assert {s for f in faulty for s in spans if f.name.endswith(s)} == set(spans)


def test_plan_step_is_counted_as_the_steps_line_counts():
    # the allocator's step k runs from its k-th step mark to the next; its first mark ended the training step
    # that first told it (2 for an inferred Session.run step), so its step 9 is training step 11
    report = {"steps": {"count": 12, "first_told_step": 2},
              "allocator": {"plan": {"source": "profiled", "made_at_step": 9}}}
    assert G.plan_words(report) == "plan profiled, in use from step 11"
    report["steps"]["count"] = 10
    assert G.plan_words(report) == "plan profiled, made after the last step (10): no step ran with it"
    del report["steps"]["first_told_step"]   # a steps file that does not say: the allocator's own numbering, named
    assert G.plan_words(report) == "plan profiled, in use from the allocator's step 9"
