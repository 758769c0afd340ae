# rtkit.scheduler -- stage-aware thread-pool scheduler for TensorFlow sessions (installed as rtkit.scheduler).
