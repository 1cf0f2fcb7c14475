"""The ops layer: what runs on created groups.

Collectives over any family (``collectives``), pipeline neighbours and
point-to-point batches (``pipeline``), and the tensor-parallel autograd
mappings (``autograd``, public as ``hypergrid.autograd``). Each is a facet
of ``HyperCommGrid`` or a function over one; none creates a group itself.
"""
