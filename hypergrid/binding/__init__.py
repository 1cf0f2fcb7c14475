"""The binding layer: the thin torch.distributed plumbing under the grid.

A world's failure news (``alarm``: its ``Alarm``, and the ``Job`` its worlds share), the creation
strategies that call torch (``creation``), per-family options and tags
(``options``), registry keys and entries (``registry``), and ``Facet``,
the base every facet object of ``HyperCommGrid`` builds on (``facet``).
"""
