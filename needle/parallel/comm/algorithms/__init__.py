"""The collective algorithms: pure references, the same as generators over messages (ring,
latency-bound, hierarchical), what each sends (``steps.py``), the one table of them with the
chooser (``select.py``) and the cost model that prices what they send."""
