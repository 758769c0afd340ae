# rtkit.bench -- the interleaved benchmark runner (`rtkit bench`) and its catalogue of peer configurations.
"""Modules: peers (named configurations), stats (rotation, medians, ratios), runner (one process per run
through `rtkit run`), output (table, bench.json, bench.md). Nothing here imports TensorFlow."""
