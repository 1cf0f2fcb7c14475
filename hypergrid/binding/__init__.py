"""The binding layer: the thin torch.distributed plumbing under the grid.

State that lives as long as the default group (``worldstate``), the creation
strategies that call torch (``creation``), per-family options and tags
(``options``), registry keys and entries (``registry``), and ``GridFacet``,
the base every capability mixin of ``HyperCommGrid`` builds on (``facet``).
"""
