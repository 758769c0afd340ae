# keras_epochs.py -- Keras fit's epochs summed up: what the steps file keeps of them, and what the report shows.
"""The training process keeps every epoch of its fits in memory and writes their summary (this module's
keras_summary over all of them) into its steps file, with the latest EPOCH_S_KEPT epochs' wall times: a job of
many short fits (17 models of TensorFlow Recommenders' DCN example) rewrote a list that grew with every epoch."""
from __future__ import annotations

import statistics
from typing import Any, Dict, List, Optional

EPOCH_S_KEPT = 500   # the latest epochs' wall times the summary lists (the comparison's samples); counts cover all


def keras_summary(epochs: List[dict]) -> Optional[Dict[str, Any]]:
    """Keras fit's epochs: wall time each (validation and callbacks included) and per train batch."""
    epochs = [e for e in epochs if isinstance(e, dict) and isinstance(e.get("epoch_s"), (int, float))]
    if not epochs:
        return None
    secs = [e["epoch_s"] for e in epochs]
    batches = sum(int(e.get("train_batches") or 0) for e in epochs)
    # per epoch, as Keras' progress bar prints it: the epoch's time over its train batches
    per_batch = [e["epoch_s"] * 1000.0 / e["train_batches"] for e in epochs if e.get("train_batches")]
    return {"epochs": len(epochs), "epoch_s": secs[-EPOCH_S_KEPT:], "epoch_s_median": round(statistics.median(secs), 4),
            "train_batches": batches,
            "epoch_step_ms_median": round(statistics.median(per_batch), 3) if per_batch else None,
            "validation": any(bool(e.get("validation")) for e in epochs)}
