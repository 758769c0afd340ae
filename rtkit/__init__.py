# rtkit -- memory allocator and runtime tuning layer for TensorFlow sparse-model training on CPU.
"""Public API: `rtkit.step()` marks a training step in a custom loop run under `rtkit run`.

This module stays light: importing it never imports TensorFlow or installs hooks."""

__version__ = "0.1.0"


def step() -> None:
    """Mark the end of one training step (for loops that rtkit's hooks cannot see)."""
    from rtkit.hooks import steps  # lazy: nothing is loaded until the first call

    steps.manual_step()


__all__ = ["step", "__version__"]
