"""The binding layer: the thin torch.distributed plumbing under the grid.

The registry of worlds (``worldstate``: ``WORLDS``, each world's state), the creation
strategies that call torch (``creation``), per-family options and tags
(``options``), registry keys and entries (``registry``), and ``Facet``,
the base every facet object of ``HyperCommGrid`` builds on (``facet``).
"""
