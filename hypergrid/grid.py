"""``HyperCommGrid``: the torch.distributed binding over ``GridLayout``.

The API follows Megatron-Core's ``HyperCommGrid``: a grid is planned offline
(no process group needed), and the process groups of a combination of dims are
created only when ``HyperCommGrid.create_pg`` is called, collectively over
the default group, through ``torch.distributed.new_subgroups_by_enumeration``.
"""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Sequence
from typing import Any

import torch.distributed as dist

from hypergrid.collectives import Collectives
from hypergrid.creation import check_can_split, check_strategy, create_family
from hypergrid.errors import (
    BackendError,
    GroupExistsError,
    GroupNotFoundError,
    InvalidArgumentError,
    UnexpectedArgumentError,
    WorldSizeError,
)
from hypergrid.getters import CoordinateGetters
from hypergrid.guard import CreationRequest, agree, members_scope, world_scope
from hypergrid.layout import Dims, GridLayout, resolve_shape
from hypergrid.mesh import MeshExport
from hypergrid.nodes import NodeAwareness
from hypergrid.pipeline import Pipeline
from hypergrid.values import check_timeout
from hypergrid.views import Views
from hypergrid.worldstate import held_group_count

__all__ = ["HyperCommGrid", "world_size_hint"]

# Keyword arguments create_pg hands on to torch.distributed.new_subgroups_by_enumeration.
_PASS_THROUGH = ("timeout", "pg_options", "group_desc")


def world_size_hint() -> int | None:
    """The world size, if known: from torch.distributed, else from ``WORLD_SIZE``.

    Returns ``None`` when neither is available (a grid planned offline).

    Raises:
        WorldSizeError: ``WORLD_SIZE`` is set but is not a positive int.

    Examples:
        >>> import os
        >>> os.environ["WORLD_SIZE"] = "16"
        >>> world_size_hint()
        16
        >>> del os.environ["WORLD_SIZE"]
    """
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    value = os.environ.get("WORLD_SIZE")
    if value is None:
        return None
    try:
        world = int(value)
    except ValueError:
        world = 0
    if world < 1:
        raise WorldSizeError(f"environment variable WORLD_SIZE={value!r} is not a positive int")
    return world


def _normalize_backend(backend: object, what: str) -> str | None:
    if backend is None:
        return None
    if not isinstance(backend, str) or not backend:
        raise BackendError(f"{what} must be None or a backend name such as 'nccl' or 'gloo', got {backend!r}")
    return backend.lower()


class HyperCommGrid(CoordinateGetters, NodeAwareness, Views, MeshExport, Collectives, Pipeline):
    """An N-dimensional grid of ranks with named dims and lazily created process groups.

    ``dim_names[0]`` is the innermost dim (consecutive ranks), as in
    Megatron-Core's ``HyperCommGrid`` and its ``order`` strings: the grid
    ``HyperCommGrid([2, 3, 4, 5], ["tp", "cp", "pp", "dp"])`` lays out ranks as
    ``initialize_model_parallel(tp=2, cp=3, pp=4, order="tp-cp-pp-dp")`` does at
    world size 120.

    Constructing a grid creates no process group and needs no initialized
    ``torch.distributed``. When the world size is known (initialized, or
    ``WORLD_SIZE`` set), a grid that does not fit in it is refused.

    Args:
        shape: size of each dim, innermost first; one size may be ``-1``, inferred
            from the world size (as ezpz infers dp).
        dim_names: one identifier per dim.
        rank_offset: first rank of the grid when it does not span the world.
        backend: backend for the groups this grid creates; ``None`` uses the
            default group's.
        strategy: how families are created: ``"enumerate"`` (default, every
            rank creates every group), ``"local"`` (members create only their
            own group) or ``"split"`` (NCCL ``split_group``); see
            ``hypergrid.creation``. ``create_pg`` can override it per call.
        guard: check, before each creation, that every participating rank asks
            for the same family of the same grid at the same point (see
            ``hypergrid.guard``); a mismatch or a missing rank raises on all
            of them instead of hanging. On by default.
        guard_timeout_s: how long the guard waits for the other ranks.

    Raises:
        GridSpecError: invalid shape, names or offset.
        WorldSizeError: ``rank_offset + size`` exceeds the known world size.
        BackendError: ``backend`` is not None or a backend name.
        InvalidArgumentError: unknown ``strategy``, or a bad ``guard_timeout_s``.

    Examples:
        >>> grid = HyperCommGrid([2, 2, 2], ["tp", "cp", "dp"])
        >>> grid.size
        8
        >>> grid.get_rank_enum(["dp", "tp"])
        [[0, 1, 4, 5], [2, 3, 6, 7]]
        >>> grid
        HyperCommGrid(shape=[2, 2, 2], dim_names=['tp', 'cp', 'dp'], rank_offset=0, backend=None, groups=[])
    """

    def __init__(
        self,
        shape: Sequence[int],
        dim_names: Sequence[str],
        rank_offset: int = 0,
        backend: str | None = None,
        *,
        strategy: str = "enumerate",
        guard: bool = True,
        guard_timeout_s: float = 300.0,
    ) -> None:
        world = world_size_hint()
        self.layout = GridLayout(resolve_shape(shape, world, rank_offset), dim_names, rank_offset)
        self.backend = _normalize_backend(backend, "backend")
        self.strategy = check_strategy(strategy)
        if not isinstance(guard, bool):
            raise InvalidArgumentError(f"guard must be True or False, got {guard!r}")
        self.guard = guard
        self.guard_timeout_s = check_timeout(guard_timeout_s, "guard_timeout_s")
        self._check_fits(world)
        # Canonical key -> the caller's group (None where the caller is in no group).
        self._groups: dict[str, dist.ProcessGroup | None] = {}
        # Creations asked of this grid so far (never reset): part of what the guard compares.
        self._creations = 0
        # For a view: the grid it folds, and the dims whose families it takes from there.
        self._parent: HyperCommGrid | None = None
        self.shared_dims: tuple[str, ...] = ()
        self._borrowed: set[str] = set()  # keys whose group belongs to the parent grid

    # -- attributes ---------------------------------------------------------

    @property
    def shape(self) -> list[int]:
        """Size of each dim, innermost first."""
        return list(self.layout.shape)

    @property
    def dim_names(self) -> list[str]:
        """Name of each dim, innermost first."""
        return list(self.layout.dim_names)

    @property
    def rank_offset(self) -> int:
        """The grid's first rank."""
        return self.layout.rank_offset

    @property
    def size(self) -> int:
        """Number of ranks in the grid."""
        return self.layout.size

    def __repr__(self) -> str:
        return (
            f"HyperCommGrid(shape={self.shape}, dim_names={self.dim_names}, "
            f"rank_offset={self.rank_offset}, backend={self.backend!r}, groups={list(self._groups)})"
        )

    # -- checks -------------------------------------------------------------

    def _check_fits(self, world: int | None) -> None:
        if world is not None and self.rank_offset + self.size > world:
            raise WorldSizeError(
                f"grid of shape {self.shape} ({self.size} ranks) with rank_offset {self.rank_offset} "
                f"needs ranks up to {self.rank_offset + self.size - 1}, but the world has {world} ranks "
                f"(0..{world - 1})"
            )

    def _creation_options(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(kwargs) - set(_PASS_THROUGH) - {"backend"})
        if unknown:
            raise UnexpectedArgumentError(
                f"create_pg got unexpected keyword argument(s) {unknown}; accepted: {[*_PASS_THROUGH, 'backend']}"
            )
        options = {name: kwargs[name] for name in _PASS_THROUGH if name in kwargs}
        timeout = options.get("timeout")
        if timeout is not None and not (isinstance(timeout, datetime.timedelta) and timeout.total_seconds() > 0):
            raise InvalidArgumentError(f"timeout must be a positive datetime.timedelta or None, got {timeout!r}")
        desc = options.get("group_desc")
        if desc is not None and not isinstance(desc, str):
            raise InvalidArgumentError(f"group_desc must be a str or None, got {desc!r}")
        backend = self.backend
        if "backend" in kwargs:
            asked = _normalize_backend(kwargs["backend"], "create_pg's backend")
            if backend is not None and asked is not None and asked != backend:
                raise BackendError(
                    f"create_pg was asked for backend {kwargs['backend']!r} but this grid was built "
                    f"with backend {self.backend!r}; build a separate grid for another backend"
                )
            backend = backend or asked
        options["backend"] = backend
        return options

    # -- groups -------------------------------------------------------------

    def get_rank_enum(self, dims: Dims) -> list[list[int]]:
        """The ranks of every group of the family over ``dims`` (pure, no torch call).

        Exactly what ``create_pg`` passes to ``new_subgroups_by_enumeration``;
        dims in any order give the same result.

        Raises:
            DimsError: unknown, repeated or no dims.

        Examples:
            >>> HyperCommGrid([2, 2, 2], ["a", "b", "c"]).get_rank_enum(["b", "a"])
            [[0, 1, 2, 3], [4, 5, 6, 7]]
        """
        return self.layout.rank_enum(dims)

    def create_pg(self, dims: Dims, *, strategy: str | None = None, **kwargs: Any) -> dist.ProcessGroup | None:
        """Create the process groups of the family over ``dims``; return the caller's.

        Collective: with strategies ``"enumerate"`` and ``"split"`` every rank
        of the default group must call it, for the same dims, in the same
        order; with ``"local"`` the members of each group must. Keyword
        arguments ``timeout``, ``pg_options`` and ``group_desc`` are passed to
        torch (``new_subgroups_by_enumeration``, ``new_group`` or
        ``split_group``); ``backend`` may be given if it agrees with the grid's.
        ``strategy`` overrides the grid's for this family.

        Returns:
            The group holding the calling rank, or ``None`` on ranks outside the grid.

        Raises:
            DimsError: unknown, repeated or no dims.
            GroupExistsError: (a ``KeyError``) this family was already created.
            UnexpectedArgumentError: an unknown keyword argument.
            BackendError: ``backend`` conflicts with the grid's, or ``"split"``
                where the default group cannot split.
            InvalidArgumentError: unknown ``strategy``.
            NotInitializedError: torch.distributed is not initialized.
            WorldSizeError: the grid does not fit in the world.
            DesyncError: (guard on) the participating ranks asked for different things.
            GuardTimeoutError: (guard on) some participating ranks did not arrive in time.

        Examples:
            A one-rank world, so that it runs anywhere:

            >>> import torch.distributed as dist
            >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
            >>> grid = HyperCommGrid([1, 1], ["tp", "dp"])
            >>> group = grid.create_pg(["dp", "tp"], group_desc="TP_DP")
            >>> dist.get_process_group_ranks(group), group.group_desc, grid.created_keys
            ([0], 'TP_DP', ['dp-tp'])
            >>> grid.get_pg("tp-dp") is group
            True
            >>> grid.destroy()
            >>> dist.destroy_process_group()
        """
        key = self.layout.key(dims)
        options = self._creation_options(kwargs)
        chosen = self.strategy if strategy is None else check_strategy(strategy)
        if key in self._groups:
            raise GroupExistsError(
                f"the process group for dims {dims!r} (key {key!r}) was already created on this grid; "
                "use get_pg to fetch it, or destroy() the grid's groups first"
            )
        if self._parent is not None and set(self.layout.canonical_dims(key)) <= set(self.shared_dims):
            # A family over shared dims only is the grid's own group object.
            group = self._parent.pg(list(self.layout.canonical_dims(key)), strategy=strategy, **kwargs)
            self._groups[key] = group
            self._borrowed.add(key)
            return group
        self._require_initialized("create_pg")
        world = dist.get_world_size()
        self._check_fits(world)
        if chosen == "split":
            check_can_split(options["backend"])
        # Only members-only creation needs the caller's own group: skip that O(group) work otherwise.
        rank = dist.get_rank()
        local = chosen == "local" and self.layout.contains(rank)
        my_ranks = self.layout.group_ranks(key, rank) if local else None
        sequence = self._creations
        self._creations += 1
        if self.guard:
            if chosen == "local":
                participants, scope = my_ranks or [], members_scope(my_ranks) if my_ranks else ""
            else:
                participants, scope = list(range(world)), world_scope()
            request = CreationRequest(
                grid=self._describe(),
                key=key,
                strategy=chosen,
                grid_sequence=sequence,
                held_groups=held_group_count() if chosen == "local" else None,
            )
            agree(request, participants, scope, self.guard_timeout_s)
        rank_enum = None if chosen == "local" else self.layout.rank_enum(key)
        group = create_family(chosen, rank_enum, my_ranks, options)
        self._groups[key] = group
        return group

    def pg(self, dims: Dims, **kwargs: Any) -> dist.ProcessGroup | None:
        """The caller's group over ``dims``, created on first use.

        **Collective on first use** (it calls ``create_pg``, with the same
        rules): every rank that takes part must call it for the same dims in the
        same order. With the guard on (the default) a rank that asks for
        something else makes every participant raise ``DesyncError`` instead of
        hanging. Later calls are local lookups; keyword arguments are used only
        on the creating call.

        Examples:
            >>> import torch.distributed as dist
            >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
            >>> grid = HyperCommGrid([1], ["dp"])
            >>> grid.pg("dp") is grid.pg("dp") is grid.get_pg("dp")
            True
            >>> grid.destroy(); dist.destroy_process_group()
        """
        key = self.layout.key(dims)
        if key in self._groups:
            return self._groups[key]
        return self.create_pg(key, **kwargs)

    def _describe(self) -> str:
        return (
            f"grid shape={self.shape} dim_names={self.dim_names} rank_offset={self.rank_offset} "
            f"backend={self.backend!r}"
        )

    def get_pg(self, dims: Dims) -> dist.ProcessGroup | None:
        """The caller's group of an already created family (a local lookup).

        Returns ``None`` on ranks outside the grid.

        Raises:
            DimsError: unknown, repeated or no dims.
            GroupNotFoundError: (a ``KeyError``) the family was not created yet.

        Examples:
            >>> HyperCommGrid([2, 2], ["tp", "dp"]).get_pg("tp")  # doctest: +ELLIPSIS
            Traceback (most recent call last):
              ...
            hypergrid.errors.GroupNotFoundError: no process group for dims 'tp' (key 'tp'); ...
        """
        key = self.layout.key(dims)
        try:
            return self._groups[key]
        except KeyError:
            raise GroupNotFoundError(
                f"no process group for dims {dims!r} (key {key!r}); created so far: "
                f"{list(self._groups)}; call create_pg({key!r}) first"
            ) from None

    @property
    def created_keys(self) -> list[str]:
        """Canonical keys of the families created so far, in creation order."""
        return list(self._groups)

    def is_current_rank_in_grid(self) -> bool:
        """Whether the calling rank is one of the grid's ranks.

        Raises:
            NotInitializedError: torch.distributed is not initialized.
        """
        self._require_initialized("is_current_rank_in_grid")
        return self.layout.contains(dist.get_rank())

    def destroy(self) -> None:
        """Destroy the process groups this grid created on the calling rank.

        Only this grid's groups that hold the caller are destroyed, each once
        (a view leaves the groups it shares with its grid to that grid: destroy
        views before their grid);
        groups that torch has already destroyed (for instance by
        ``destroy_process_group()`` of the default group) are skipped.
        Idempotent; the grid can create its families again afterwards.
        """
        unique = {
            id(group): group for key, group in self._groups.items() if group is not None and key not in self._borrowed
        }
        self._groups.clear()
        self._borrowed.clear()
        if not (dist.is_available() and dist.is_initialized()):
            return
        for group in unique.values():
            # ValueError: torch no longer knows this group; it was destroyed elsewhere.
            with contextlib.suppress(ValueError):
                dist.destroy_process_group(group)
