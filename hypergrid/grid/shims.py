"""Compatibility shims: Megatron-Core's private ``HyperCommGrid`` helpers, over hypergrid's one enumeration.

Megatron's tests and downstream code call ``_gen_rank_enum``,
``_gen_rank_enum_for``, ``_order_dims`` and ``_order_dims_for`` although they are
private, so a drop-in must have them. Each is a thin shim over
``hypergrid.layout.GridLayout`` (the canonical enumeration): none enumerates
ranks by itself. Only ``_gen_rank_enum`` differs from the canonical result, as
Megatron documents: the members of each group vary with the *last* requested dim
fastest (dims given ``["a", "b"]`` give groups in "b-a" order), where the
canonical enumeration sorts the dims first.
"""

from __future__ import annotations

from collections.abc import Sequence

from hypergrid.binding.facet import Facet
from hypergrid.layout import KEY_SEPARATOR, Dims, GridLayout

__all__ = ["MegatronShims"]


def _as_list(dims: Dims) -> list[str]:
    return [dims] if isinstance(dims, str) else list(dims)


def _in_given_order(layout: GridLayout, dims: Dims) -> list[list[int]]:
    """The canonical family over ``dims`` with each group's members re-ordered: the last given dim fastest."""
    names = _as_list(dims)
    canonical = list(layout.canonical_dims(names))  # outermost first: the canonical member order
    family = layout.rank_enum_array(names)
    sizes = [layout.dim_size(name) for name in canonical]
    members = family.reshape(family.shape[0], *sizes)
    # Axis 0 is the group; put the member axes in the given order (first given = outermost).
    order = [0, *(1 + canonical.index(name) for name in names)]
    regrouped: list[list[int]] = members.transpose(order).reshape(family.shape[0], -1).tolist()
    return regrouped


class MegatronShims(Facet):
    """Megatron-Core's private helpers, for drop-in compatibility (a facet object of ``HyperCommGrid``)."""

    def _gen_rank_enum(self, dims: Dims) -> list[list[int]]:
        """Megatron's ``_gen_rank_enum``: the family over ``dims``, members in the REVERSE order of ``dims``.

        A compatibility shim: use ``get_rank_enum`` (canonical, order-free) in new code.

        Examples:
            >>> from hypergrid import HyperCommGrid
            >>> grid = HyperCommGrid([2, 2, 2], ["a", "b", "c"])
            >>> grid._gen_rank_enum(["a", "b"]), grid.get_rank_enum(["a", "b"])
            ([[0, 2, 1, 3], [4, 6, 5, 7]], [[0, 1, 2, 3], [4, 5, 6, 7]])
        """
        return _in_given_order(self.layout, dims)

    def _gen_rank_enum_for(self, shape: Sequence[int], dim_names: Sequence[str], dims: Dims) -> list[list[int]]:
        """Megatron's ``_gen_rank_enum_for``: ``_gen_rank_enum`` for another shape and names at this grid's offset.

        Examples:
            >>> from hypergrid import HyperCommGrid
            >>> HyperCommGrid([8], ["dp"])._gen_rank_enum_for([2, 4], ["ep", "edp"], ["ep"])
            [[0, 1], [2, 3], [4, 5], [6, 7]]
        """
        return _in_given_order(GridLayout(shape, dim_names, self.layout.rank_offset), dims)

    def _order_dims_for(self, dim_names: Sequence[str], dims: Dims) -> tuple[list[str], str]:
        """Megatron's ``_order_dims_for``: ``dims`` outermost first against ``dim_names``, and their key.

        Examples:
            >>> from hypergrid import HyperCommGrid
            >>> HyperCommGrid([8], ["dp"])._order_dims_for(["tp", "cp", "dp"], ["tp", "dp"])
            (['dp', 'tp'], 'dp-tp')
        """
        ordered = list(GridLayout([1] * len(dim_names), dim_names).canonical_dims(_as_list(dims)))
        return ordered, KEY_SEPARATOR.join(ordered)

    def _order_dims(self, dims: Dims) -> tuple[list[str], str]:
        """Megatron's ``_order_dims``: ``dims`` in canonical order (outermost first) and the canonical key.

        Examples:
            >>> from hypergrid import HyperCommGrid
            >>> HyperCommGrid([2, 2, 2], ["tp", "cp", "dp"])._order_dims(["tp", "dp"])
            (['dp', 'tp'], 'dp-tp')
        """
        ordered = list(self.layout.canonical_dims(_as_list(dims)))
        return ordered, KEY_SEPARATOR.join(ordered)
