"""The command line: ``python -m hypergrid show|plan|demo`` (``show``, ``plan``, ``demo``)."""
