"""The collective algorithms: pure references, the same as generators over messages
(ring, latency-bound, hierarchical), what each sends (``Steps``), the one table of them
(``table.py``) and the cost model that prices them."""
