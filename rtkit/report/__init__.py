# rtkit.report -- the report model (model.py) and its renderers (terminal, HTML, compare); reads run directories only.
