"""The layout layer: pure rank arithmetic (numpy and einops, never torch).

What a grid *is*, before any process group exists: its spec (names, shape,
offset), coordinates, the families of any combination of dims and their
canonical keys (``grid_layout``), node splits for hierarchical families
(``hierarchy``), the partition signature behind group sharing (``economy``)
and DeviceMesh planning (``meshspec``). Every layer above stands on it.

Examples:
    >>> from hypergrid.layout import GridLayout
    >>> GridLayout([2, 2, 2], ["a", "b", "c"]).rank_enum(["a", "c"])
    [[0, 1, 4, 5], [2, 3, 6, 7]]
"""

from hypergrid.layout.grid_layout import KEY_SEPARATOR, MAX_WORLD_SIZE, Dims, GridLayout, resolve_shape

__all__ = ["KEY_SEPARATOR", "MAX_WORLD_SIZE", "Dims", "GridLayout", "resolve_shape"]
