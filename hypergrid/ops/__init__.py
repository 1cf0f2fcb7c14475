"""The ops layer: what runs on created groups.

Collectives over any family (``collectives``), bucketed gradient averaging
(``gradients``), pipeline neighbours, point-to-point batches and ``exchange``
(``pipeline``), and the tensor-parallel autograd mappings (``autograd``,
public as ``hypergrid.autograd``). Each is a facet of ``HyperCommGrid`` or a
function over one; none creates a group itself.
"""
