# __init__.py -- bundled EmbeddingVariable-style TensorFlow workloads (Wide&Deep, DLRM) on synthetic Criteo data.
"""Ordinary TensorFlow training scripts that rtkit's demo, tests and benchmarks run.

They never import rtkit's hooks: rtkit finds their steps from outside, as for any user's script.
``python -m rtkit.workloads wdl`` runs one from the command line; ``run(...)`` from Python.
TensorFlow is imported only when a workload runs (``rtkit.workloads.data`` needs numpy only).
"""

MODELS = ("wdl", "dlrm")
APIS = ("session", "monitored", "keras", "tf2")


def run(model="wdl", api="session", **kwargs):
    """Train one workload; returns a dict with steps, losses, loss_first/last, examples_per_s...

    Keyword arguments: steps, batch, rows, data_dir, seed, emb_dim, capacity, epochs,
    learning_rate, threads_inter, threads_intra, print_losses, progress (see train.run)."""
    from rtkit.workloads import train  # lazy: imports TensorFlow

    return train.run(model=model, api=api, **kwargs)


__all__ = ["run", "MODELS", "APIS"]
