# rtkit.bootstrap -- holds the sitecustomize.py that rtkit run puts on the child's PYTHONPATH.
