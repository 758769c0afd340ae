# __init__.py -- rtkit on TensorFlow's parameter-server runtime: task specs, the local launcher, merged reports.
"""rtkit wraps TF's gRPC parameter-server runtime, it never replaces it.

- :mod:`rtkit.cluster.spec`: which task this process is (TF_CONFIG or the classic
  ``--job_name/--task_index/--ps_hosts/--worker_hosts`` flags), validated into one line on error.
- :mod:`rtkit.cluster.taskdir`: one run directory per task (and per restart) in a shared folder.
- :mod:`rtkit.cluster.launcher`: ``rtkit launch``, a local cluster of real TF servers on localhost.
- :mod:`rtkit.cluster.merge`: one report for a cluster folder (tables per task, stragglers, timeline).

Nothing here imports TensorFlow.
"""
