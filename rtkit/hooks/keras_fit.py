# keras_fit.py -- patches Model.fit of Keras 3 and of Keras 2 (tf_keras) to add a step-timing callback, user's callbacks unchanged.
from __future__ import annotations

import time

from rtkit.hooks import registry, tf_function
from rtkit.hooks.steps import minor_faults, recorder

_PATCHED_FLAG = "_rtkit_patched"


def _make_callback(keras):
    rec = recorder()

    class RtkitStepCallback(keras.callbacks.Callback):
        """Times each training batch as one step."""

        def __init__(self):
            super().__init__()
            self._start = None
            self._epoch = None

        def on_epoch_begin(self, epoch, logs=None):
            self._epoch = (time.perf_counter(), 0)

        def on_epoch_end(self, epoch, logs=None):
            # Keras calls this after the epoch's validation: the epoch time includes it, the batch times do not
            if self._epoch is None:
                return
            t0, batches = self._epoch
            self._epoch = None
            validation = any(str(k).startswith("val_") for k in (logs or {}))
            rec.record_epoch(time.perf_counter() - t0, batches, validation)

        def on_train_batch_begin(self, batch, logs=None):
            self._start = (time.time(), time.perf_counter(), minor_faults())

        def on_train_batch_end(self, batch, logs=None):
            if self._start is None:
                return
            start_unix, t0, f0 = self._start
            self._start = None
            if self._epoch is not None:
                self._epoch = (self._epoch[0], self._epoch[1] + 1)
            rec.record("keras", "keras.Model.fit", start_unix, (time.perf_counter() - t0) * 1000.0,
                       minor_faults() - f0, "Keras Model.fit (train batches)")

    return RtkitStepCallback


def install(keras) -> None:
    model_cls = keras.Model
    if getattr(model_cls, _PATCHED_FLAG, False):
        return
    callback_cls = _make_callback(keras)
    orig_fit = model_cls.fit

    def with_step_callback(callbacks):
        """The user's callbacks plus rtkit's, leaving a CallbackList (already built by the user) as it is."""
        if isinstance(callbacks, keras.callbacks.CallbackList):
            return callbacks
        callbacks = list(callbacks or [])
        if not any(isinstance(c, callback_cls) for c in callbacks):
            callbacks.append(callback_cls())
        return callbacks

    def with_dataset_filters(args, kwargs):
        """A tf.data input (x) goes through the components' dataset filters (the scheduler's stage pools)."""
        if args:
            x = args[0]
        else:
            x = kwargs.get("x")
        if x is None or not registry.dataset_filters:
            return args, kwargs
        for fn in list(registry.dataset_filters):
            try:
                x = fn(x, origin="fit")
            except Exception as exc:
                rec.notes.append(f"dataset filter {getattr(fn, '__name__', fn)} failed: {exc!r}")
        if args:
            return (x,) + tuple(args[1:]), kwargs
        return args, dict(kwargs, x=x)

    rec = recorder()

    def fit(self, *args, **kwargs):
        with rec.lock:
            rec.keras_fit_calls += 1   # a fit whose first batch fails leaves no step: no_step_reason says so
        args, kwargs = with_dataset_filters(args, kwargs)
        if len(args) > 5:  # callbacks given positionally: (x, y, batch_size, epochs, verbose, callbacks, ...)
            args = args[:5] + (with_step_callback(args[5]),) + args[6:]
        else:
            kwargs["callbacks"] = with_step_callback(kwargs.get("callbacks"))
        with tf_function.not_steps():   # the batches are counted by the callback, not as the tf.function calls they make
            return orig_fit(self, *args, **kwargs)

    fit.__wrapped__ = orig_fit
    fit.__doc__ = orig_fit.__doc__
    model_cls.fit = fit
    setattr(model_cls, _PATCHED_FLAG, True)
