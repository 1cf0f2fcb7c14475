"""Tensor-parallel mappings as autograd functions (the public path of ``hypergrid.ops.autograd``)."""

from hypergrid.ops.autograd import (
    copy_to,
    gather_from,
    gather_from_sequence,
    reduce_from,
    reduce_scatter_to,
    scatter_to,
)

__all__ = ["copy_to", "gather_from", "gather_from_sequence", "reduce_from", "reduce_scatter_to", "scatter_to"]
