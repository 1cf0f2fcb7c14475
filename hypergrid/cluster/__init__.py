"""The cluster layer: what a cluster is and where a grid's groups land on it (pure, no torch).

Tiers and presets (``tiers``), fitting them to measured all-reduce rows
(``calibrate``), how many units of each tier a family's groups span
(``spans``), and the placement report's pure part (``placement``). The grid's
``placement_report`` and the planner (``hypergrid.topology``) stand on it.
"""
