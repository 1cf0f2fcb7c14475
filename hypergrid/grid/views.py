"""Views: other factorizations of a grid's ranks (MoE parallel folding), sharing groups over shared dims.

One implementation serves both APIs: Megatron-Core's ``register_view(name, ...)``
with ``view=`` on every lookup, and hypergrid's ``view(...)``, which registers a
view the same way and returns a grid bound to it. Every view lives in the root
grid's ``_views``; every group lives in the root grid's ``_pgs`` under
Megatron's keys: a dash-joined canonical string for the base view (and for a
view's family over shared dims only, which *is* the base group), and
``(view_name, dims_tuple)`` for a view's private families.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from hypergrid.binding.facet import Facet
from hypergrid.errors import GridSpecError
from hypergrid.grid.core import BASE_VIEW, RankView
from hypergrid.layout import MAX_WORLD_SIZE, GridLayout
from hypergrid.values import as_int, is_int, shown

__all__ = ["BASE_VIEW", "RankView", "Views"]


def _check_sequences(shape: object, dim_names: object, shared_dims: object) -> None:
    for what, value in (("shape", shape), ("dim_names", dim_names), ("shared_dims", shared_dims)):
        if value is None and what == "shared_dims":
            continue
        if isinstance(value, (str, bytes)) or not isinstance(value, (Sequence, np.ndarray)):
            raise GridSpecError(f"a view's {what} must be a list or tuple, got {shown(value)}")
        if what != "shape" and not all(isinstance(item, str) for item in value):
            raise GridSpecError(f"a view's {what} must be a list of str (dim names), got {shown(value)}")


def _check_name(name: object) -> str:
    """A view's name: a non-empty, printable (one-line) str of at most 256 characters."""
    if not isinstance(name, str) or not 0 < len(name) <= 256 or not name.isprintable():
        raise GridSpecError(
            f"a view name must be a non-empty, printable str of at most 256 characters, got {shown(name)}"
        )
    return name


def _check_view_spec(root: Any, name: object, shape: Sequence[int], dim_names: Sequence[str]) -> None:
    _check_name(name)
    if name in root._core.registry.views:
        raise GridSpecError(
            f"View {shown(name)} is already registered; registered views: {sorted(root._core.registry.views)}"
        )
    if len(shape) != len(dim_names):
        raise GridSpecError(
            f"len(shape) {shown(list(shape))} != len(dim_names) {shown(list(dim_names))} for view {shown(name)}: "
            "give one name per dim"
        )
    if len(set(dim_names)) != len(dim_names):
        repeated = sorted({n for n in dim_names if list(dim_names).count(n) > 1})
        raise GridSpecError(f"View {shown(name)} has duplicate dim_names: {list(dim_names)} repeat {repeated}")
    if any(not is_int(size) or size < 1 for size in shape):
        raise GridSpecError(f"View {shown(name)} shape must be positive ints, got {shown(list(shape))}")
    size = math.prod(int(s) for s in shape)
    if size != root.size:
        raise GridSpecError(
            f"View {shown(name)} shape {shown(list(shape))} has size {shown(size)}, but the grid size is {root.size}: "
            f"a view must cover the same {root.size} ranks as the grid {root.shape}"
        )


def _check_shared(root: Any, name: str, layout: GridLayout, shared: list[str]) -> None:
    if len(set(shared)) != len(shared):
        raise GridSpecError(f"View {shown(name)} has duplicate shared_dims: {shared}")
    base = root.layout
    for dim in shared:
        if dim not in base.dim_names:
            raise GridSpecError(
                f"Shared dim {shown(dim)} of view {shown(name)} is not in the base view {list(base.dim_names)}"
            )
        if dim not in layout.dim_names:
            raise GridSpecError(
                f"Shared dim {shown(dim)} of view {shown(name)} is not in the view's dim_names {list(layout.dim_names)}"
            )
    # Each shared dim alone, then all together: the groups (as sets of ranks) must be the same.
    combos = [[dim] for dim in shared] + ([shared] if len(shared) > 1 else [])
    for combo in combos:
        ours, theirs = sorted(base.rank_enum(combo)), sorted(layout.rank_enum(combo))
        if ours != theirs:
            what = f"Shared dim {shown(combo[0])} has" if len(combo) == 1 else f"Shared dims {shown(combo)} have"
            raise GridSpecError(
                f"{what} different membership across views: base view {root.shape} {root.dim_names} "
                f"enumerates {base.rank_enum(combo)[:4]}..., view {shown(name)} {list(layout.shape)} "
                f"{list(layout.dim_names)} enumerates {layout.rank_enum(combo)[:4]}..."
            )


class Views(Facet):
    """Other factorizations of the grid's ranks (a facet object of ``HyperCommGrid``)."""

    def register_view(
        self, name: str, shape: Sequence[int], dim_names: Sequence[str], shared_dims: Sequence[str] | None = None
    ) -> None:
        """Register another factorization of this grid's ranks under ``name`` (Megatron-Core's API).

        Families of the view are then created and looked up on this grid with
        ``view=name``. A family over ``shared_dims`` only is the base grid's own
        group (same object, one key, destroyed once); other families of the view
        are its own, keyed ``(name, dims)``.

        Args:
            name: the view's name (not ``"base"``, not already registered).
            shape: size of each of the view's dims, innermost first; covers the grid's ranks.
            dim_names: the view's dim names.
            shared_dims: dims of both the grid and the view whose groups are the
                same in both (default: none, as in Megatron).

        Raises:
            GridSpecError: (a ``ValueError``) the name is taken, lengths differ,
                names repeat, a size is not a positive int, the size differs, a
                shared dim repeats, is missing from either side, or has
                different membership across views.

        Examples:
            >>> from hypergrid import HyperCommGrid
            >>> grid = HyperCommGrid([2, 2, 2], ["tp", "dp", "pp"])
            >>> grid.register_view("expert", [2, 2, 2], ["expt_tp", "ep", "pp"], shared_dims=["pp"])
            >>> grid.get_rank_enum(["ep", "expt_tp"], view="expert")
            [[0, 1, 2, 3], [4, 5, 6, 7]]
        """
        root = self._core.root
        _check_sequences(shape, dim_names, shared_dims)
        _check_view_spec(root, name, shape, dim_names)
        layout = GridLayout([int(s) for s in shape], dim_names, root.rank_offset)
        shared = [] if shared_dims is None else list(shared_dims)
        _check_shared(root, name, layout, shared)
        root._core.registry.views[name] = RankView(name, list(layout.shape), list(dim_names), shared, layout)

    def view(
        self,
        shape: Sequence[int],
        dim_names: Sequence[str],
        shared_dims: Sequence[str] | None = None,
        *,
        name: str | None = None,
    ) -> Any:
        """Another factorization of the same ranks (MoE parallel folding), as a grid of its own.

        Registers the view on the root grid (``register_view``) and returns a
        grid bound to it: its ``create_pg``/``pg``/``get_pg`` and getters work on
        the view's dims, its groups live in the root grid's registry. One size of
        ``shape`` may be ``-1``, inferred from the grid's size. ``shared_dims``
        defaults to the names the two have in common. Asking again for the same
        view returns a grid bound to the same registration.

        Args:
            shape: size of each of the view's dims, innermost first (one may be -1).
            dim_names: the view's dim names.
            shared_dims: dims whose groups are the grid's (default: the common names).
            name: the registered name (default: built from the names and sizes).

        Raises:
            GridSpecError: as ``register_view``, or a name already registered
                for another factorization.

        Examples:
            >>> from hypergrid import HyperCommGrid
            >>> dense = HyperCommGrid([2, 2, 2], ["tp", "dp", "pp"])
            >>> expert = dense.view([4, -1, 2], ["ep", "edp", "pp"])
            >>> expert.shape, expert.shared_dims, expert.get_rank_enum("ep")
            ([4, 1, 2], ('pp',), [[0, 1, 2, 3], [4, 5, 6, 7]])
        """
        root = self._core.root
        _check_sequences(shape, dim_names, shared_dims)
        if name is not None:
            _check_name(name)
        sizes = self._resolve_view_shape(shape)
        common = [dim for dim in dim_names if dim in root.dim_names]
        shared = common if shared_dims is None else list(shared_dims)
        if name is None:
            name = "view:" + "-".join(f"{dim}{size}" for dim, size in zip(dim_names, sizes)) + f" shared:{shared}"
        known = root._core.registry.views.get(name)
        if known is None or (known.shape, known.dim_names, known.shared_dims) != (sizes, list(dim_names), shared):
            root.register_view(name, sizes, dim_names, shared)
        return self._bound_view(name)

    def _resolve_view_shape(self, shape: Sequence[int]) -> list[int]:
        sizes = list(shape)
        for size in sizes:
            if as_int(size) != -1 and (not is_int(size) or not 1 <= size <= MAX_WORLD_SIZE):
                raise GridSpecError(
                    f"view shape {shown(sizes)}: size {shown(size)} is not an int in 1..{MAX_WORLD_SIZE} or -1"
                )
        wild = [i for i, size in enumerate(sizes) if as_int(size) == -1]
        if len(wild) > 1:
            raise GridSpecError(f"view shape {shown(sizes)} has {len(wild)} sizes of -1; at most one can be inferred")
        if wild:
            known = math.prod(int(s) for i, s in enumerate(sizes) if i != wild[0] and is_int(s) and s > 0)
            if self._core.root.size % known:
                raise GridSpecError(
                    f"cannot infer the -1 in view shape {shown(sizes)}: the grid's {self._core.root.size} ranks are "
                    f"not a multiple of the other sizes' product {shown(known)}"
                )
            sizes[wild[0]] = self._core.root.size // known
        return sizes

    # -- registry keys --------------------------------------------------------

    def _bound_view(self, name: str) -> Any:
        root = self._core.root
        spec = root._core.registry.views[name]
        # (a view's shrink and grow are its root's: it declares no replica dim of its own)
        bound = type(root)(spec.shape, spec.dim_names, root.rank_offset, **{**root._core.init_kwargs(), "replicas": ()})
        bound._core.bind(root, name)  # a view creates through its root only (it takes no ordinal)
        return bound
