"""``HyperCommGrid``: the torch.distributed binding over :class:`~hypergrid.layout.GridLayout`.

The API follows Megatron-Core's ``HyperCommGrid``: a grid is planned offline
(no process group needed), and the process groups of a combination of dims are
created only when :meth:`HyperCommGrid.create_pg` is called, collectively over
the default group, through ``torch.distributed.new_subgroups_by_enumeration``.
"""

from __future__ import annotations

import contextlib
import datetime
import itertools
import os
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from hypergrid.creation import check_can_split, check_strategy, create_family
from hypergrid.errors import (
    BackendError,
    DimsError,
    GridSpecError,
    GroupExistsError,
    GroupNotFoundError,
    InvalidArgumentError,
    NotInitializedError,
    UnexpectedArgumentError,
    WorldSizeError,
)
from hypergrid.guard import CreationRequest, GuardLedger, agree, members_scope, world_scope
from hypergrid.layout import KEY_SEPARATOR, Dims, GridLayout, resolve_shape
from hypergrid.values import check_timeout
from hypergrid.worldstate import held_group_count

__all__ = ["HyperCommGrid", "world_size_hint"]

_TIMES = "\u00d7"  # the multiplication sign (U+00D7) between the dims of a grid's short name

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


class HyperCommGrid:
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
            :mod:`hypergrid.creation`. ``create_pg`` can override it per call.
        guard: check, before each creation, that every participating rank asks
            for the same family of the same grid at the same point (see
            :mod:`hypergrid.guard`); a mismatch or a missing rank raises on all
            of them instead of hanging. On by default.
        guard_timeout_s: how long the guard waits for the other ranks.
        guard_progress_s: while the guard waits, a warning on the ``"hypergrid"``
            logger every this many seconds (the first after
            ``min(guard_progress_s, guard_timeout_s / 4)``) names how many ranks
            arrived; silence it with
            ``logging.getLogger("hypergrid").setLevel(logging.ERROR)``.

    Raises:
        GridSpecError: invalid shape, names or offset.
        WorldSizeError: ``rank_offset + size`` exceeds the known world size.
        BackendError: ``backend`` is not None or a backend name.
        InvalidArgumentError: unknown ``strategy``, or a bad ``guard_timeout_s`` or ``guard_progress_s``.

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
        guard_progress_s: float = 30.0,
    ) -> None:
        world = world_size_hint()
        self.layout = GridLayout(resolve_shape(shape, world, rank_offset), dim_names, rank_offset)
        self.backend = _normalize_backend(backend, "backend")
        self.strategy = check_strategy(strategy)
        if not isinstance(guard, bool):
            raise InvalidArgumentError(f"guard must be True or False, got {guard!r}")
        self.guard = guard
        self.guard_timeout_s = check_timeout(guard_timeout_s, "guard_timeout_s")
        self.guard_progress_s = check_timeout(guard_progress_s, "guard_progress_s")
        self._check_fits(world)
        # Canonical key -> the caller's group (None where the caller is in no group).
        self._groups: dict[str, dist.ProcessGroup | None] = {}
        # Creations asked of this grid so far (never reset): part of what the guard compares.
        self._creations = 0
        # The guard rounds of this grid whose keys may still be in the store; destroy() deletes them.
        self._guard_ledger = GuardLedger()
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

    def _require_initialized(self, what: str) -> None:
        if not (dist.is_available() and dist.is_initialized()):
            raise NotInitializedError(
                f"{what} needs torch.distributed to be initialized: call "
                "torch.distributed.init_process_group first (get_rank_enum works offline)"
            )

    def _creation_options(self, kwargs: dict[str, Any], call: str = "create_pg") -> dict[str, Any]:
        unknown = sorted(set(kwargs) - set(_PASS_THROUGH) - {"backend"})
        if unknown:
            raise UnexpectedArgumentError(
                f"{call} got unexpected keyword argument(s) {unknown}; accepted: {[*_PASS_THROUGH, 'backend']}"
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
            asked = _normalize_backend(kwargs["backend"], f"{call}'s backend")
            if backend is not None and asked is not None and asked != backend:
                raise BackendError(
                    f"{call} was asked for backend {kwargs['backend']!r} but this grid was built "
                    f"with backend {self.backend!r}; build a separate grid for another backend"
                )
            backend = backend or asked
        options["backend"] = backend
        return options

    # -- groups -------------------------------------------------------------

    def get_rank_enum(self, dims: Dims) -> list[list[int]]:
        """The ranks of every group of the family over ``dims`` (pure, no torch call).

        Exactly what :meth:`create_pg` passes to ``new_subgroups_by_enumeration``;
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
        return self._create_families({key: dims}, strategy, kwargs, "create_pg")[key]

    def create_pgs(
        self, dims_list: Sequence[Dims], *, strategy: str | None = None, **kwargs: Any
    ) -> dict[str, dist.ProcessGroup | None]:
        """Create many families in one step, behind ONE guard round; return the caller's group of each.

        Collective like `create_pg` (the same ranks take part; with
        ``"local"``, the members of the caller's group over all the batch's dims
        together), with the same keyword arguments, applied to every family.
        The families are created in one canonical order (fewest dims first, as
        ``layout.all_families()``) whatever order they are listed in, so ranks
        that list them differently still agree. Everything is checked before
        anything is created. On a view, families over shared dims only are taken
        from (or created in one more round on) the grid it folds.

        Args:
            dims_list: the families, each as `create_pg` takes dims.
            strategy: overrides the grid's for these families.
            **kwargs: ``timeout``, ``pg_options``, ``group_desc``, ``backend``, as for `create_pg`.

        Returns:
            Canonical key -> the group holding the calling rank (``None`` outside the grid), in canonical order.

        Raises:
            DimsError: ``dims_list`` is empty or not a list, an entry names an
                unknown or repeated dim, or two entries name the same family.
            GroupExistsError: (a ``KeyError``) a family was already created.
            DesyncError: (guard on) the participating ranks asked for different things.
            GuardTimeoutError: (guard on) some participating ranks did not arrive in time.
            (and every other error of `create_pg`)

        Examples:
            >>> import torch.distributed as dist
            >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
            >>> grid = HyperCommGrid([1, 1], ["tp", "dp"])
            >>> groups = grid.create_pgs([["tp", "dp"], "tp", "dp"])
            >>> list(groups), groups["dp-tp"] is grid.get_pg("tp-dp")
            (['tp', 'dp', 'dp-tp'], True)
            >>> grid.destroy(); dist.destroy_process_group()
        """
        return self._create_families(self._batch(dims_list), strategy, kwargs, "create_pgs")

    def _batch(self, dims_list: object) -> dict[str, Dims]:
        """Canonical key -> dims as given, in canonical family order; refuses empty lists and repeats."""
        if isinstance(dims_list, (str, bytes)) or not isinstance(dims_list, (list, tuple)):
            raise DimsError(
                f"create_pgs takes a list of dims (each a dim name, a key like 'dp-tp' or a list of names), "
                f"got {dims_list!r}"
            )
        if not dims_list:
            raise DimsError("create_pgs needs at least one family, got an empty list")
        families: dict[str, Dims] = {}
        for dims in dims_list:
            key = self.layout.key(dims)
            if key in families:
                raise DimsError(
                    f"create_pgs got {families[key]!r} and {dims!r}, which name the same family {key!r}; "
                    "list each family once"
                )
            families[key] = dims

        def position(key: str) -> tuple[int, int]:
            mask = sum(1 << index for index in self.layout.dim_indices(key))
            return bin(mask).count("1"), mask

        return {key: families[key] for key in sorted(families, key=position)}

    def _create_families(
        self, families: dict[str, Dims], strategy: str | None, kwargs: dict[str, Any], call: str
    ) -> dict[str, dist.ProcessGroup | None]:
        """The steps of create_pg and create_pgs: check everything, one guard round, create in order."""
        options = self._creation_options(kwargs, call)
        chosen = self.strategy if strategy is None else check_strategy(strategy)
        for key, dims in families.items():
            if key in self._groups:
                raise GroupExistsError(
                    f"the process group for dims {dims!r} (key {key!r}) was already created on this grid; "
                    "use get_pg to fetch it, or destroy() the grid's groups first"
                )
        shared = set(self.shared_dims)
        borrowed = [key for key in families if self._parent is not None and set(key.split(KEY_SEPARATOR)) <= shared]
        own = [key for key in families if key not in borrowed]
        if own:
            self._require_initialized(call)
            world = dist.get_world_size()
            self._check_fits(world)
            if chosen == "split":
                check_can_split(options["backend"])
            rank = dist.get_rank()
            local = chosen == "local" and self.layout.contains(rank)
            self._guard_round(own, chosen, options, rank if local else None, world)
            for key in own:
                # Only members-only creation needs the caller's own group: skip that O(group) work otherwise.
                my_ranks = self.layout.group_ranks(key, rank) if local else None
                rank_enum = None if chosen == "local" else self.layout.rank_enum(key)
                self._groups[key] = create_family(chosen, rank_enum, my_ranks, options)
        if borrowed:
            self._borrow(borrowed, strategy, kwargs)
        return {key: self._groups[key] for key in families}

    def _guard_round(
        self, keys: list[str], strategy: str, options: dict[str, Any], member: int | None, world: int
    ) -> None:
        """Count the creation, and (guard on) agree on it with the ranks that take part.

        ``member``: for ``"local"``, the calling rank when it is in the grid (the
        participants are its group over all of ``keys``' dims); ``None`` otherwise.
        """
        sequence = self._creations
        self._creations += 1
        if not self.guard:
            return
        if strategy == "local":
            if member is None:
                return  # outside the grid: this rank creates nothing and takes part in nothing
            dims = {name for key in keys for name in key.split(KEY_SEPARATOR)}
            participants: Sequence[int] = self.layout.group_ranks(list(dims), member)
            scope = members_scope(participants)
        else:
            participants, scope = range(world), world_scope()
        described = [(name, str(options[name])) for name in ("backend", "group_desc") if options.get(name) is not None]
        if options.get("timeout") is not None:
            described.append(("timeout", f"{options['timeout'].total_seconds():g}s"))
        if options.get("pg_options") is not None:
            described.append(("pg_options", type(options["pg_options"]).__name__))
        described.append(("guard_timeout_s", f"{self.guard_timeout_s:g}"))
        request = CreationRequest(
            grid=self._describe(),
            keys=tuple(keys),
            strategy=strategy,
            grid_sequence=sequence,
            held_groups=held_group_count() if strategy == "local" else None,
            options=tuple(described),
        )
        agree(request, participants, scope, self.guard_timeout_s, self.guard_progress_s, self._guard_ledger)

    def _borrow(self, keys: list[str], strategy: str | None, kwargs: dict[str, Any]) -> None:
        """A view's families over shared dims only are its grid's own group objects (created there if new)."""
        assert self._parent is not None
        parent = self._parent
        theirs = {key: parent.layout.key(list(self.layout.canonical_dims(key))) for key in keys}
        missing = [key for key in theirs.values() if key not in parent._groups]
        if missing:
            parent.create_pgs(missing, strategy=strategy, **kwargs)
        for key, parent_key in theirs.items():
            self._groups[key] = parent._groups[parent_key]
            self._borrowed.add(key)

    def pg(self, dims: Dims, **kwargs: Any) -> dist.ProcessGroup | None:
        """The caller's group over ``dims``, created on first use.

        **Collective on first use** (it calls :meth:`create_pg`, with the same
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
        """The grid in a few characters: ``tp2``, ``dp4`` joined by U+00D7 (``name=size`` after a final digit)."""
        sizes = (
            f"{name}={size}" if name[-1].isdigit() else f"{name}{size}"
            for name, size in zip(self.dim_names, self.shape)
        )
        text = _TIMES.join(sizes)
        if self.rank_offset:
            text += f" from rank {self.rank_offset}"
        return text if self.backend is None else f"{text} ({self.backend})"

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
        self._guard_ledger.release()
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

    # -- coordinates and per-family getters -----------------------------------

    def _rank(self, rank: int | None) -> int:
        if rank is not None:
            return rank
        self._require_initialized("a getter without an explicit rank")
        return dist.get_rank()

    def coord_of(self, rank: int) -> Any:
        """Coordinates of ``rank`` as a named tuple (fields: the dim names).

        Examples:
            >>> HyperCommGrid([2, 2, 2], ["tp", "cp", "dp"]).coord_of(6)
            Coord(tp=0, cp=1, dp=1)
        """
        return self.layout.coord_of(rank)

    def rank_of(self, base: int | None = None, /, **coords: int) -> int:
        """The rank at the named coordinates: all dims, or those to change in ``base``'s.

        With a ``base`` rank, the dims not named keep ``base``'s coordinates —
        DeepSpeed's ``stage_to_global(stage)`` is ``grid.rank_of(rank, pp=stage)``.

        Examples:
            >>> grid = HyperCommGrid([2, 2, 2], ["tp", "pp", "dp"])
            >>> grid.rank_of(tp=0, pp=1, dp=1), grid.rank_of(5, pp=1)
            (6, 7)
        """
        if base is None:
            return self.layout.rank_at(**coords)
        return self.layout.replace(base, **coords)

    def my_coord(self) -> Any:
        """The calling rank's coordinates (needs an initialized world; the rank must be in the grid)."""
        return self.layout.coord_of(self._rank(None))

    def group_ranks(self, dims: Dims, rank: int | None = None) -> list[int]:
        """The ranks of the group over ``dims`` holding ``rank`` (default: the caller). Pure, O(group).

        Examples:
            >>> HyperCommGrid([2, 2, 2], ["tp", "cp", "dp"]).group_ranks("dp-tp", rank=6)
            [2, 3, 6, 7]
        """
        return self.layout.group_ranks(dims, self._rank(rank))

    def group_rank(self, dims: Dims, rank: int | None = None) -> int:
        """``rank``'s index in its group over ``dims`` (its rank in that process group).

        Examples:
            >>> HyperCommGrid([2, 2, 2], ["tp", "cp", "dp"]).group_rank("dp-tp", rank=6)
            2
        """
        me = self._rank(rank)
        return self.layout.group_ranks(dims, me).index(me)

    def group_size(self, dims: Dims) -> int:
        """Number of ranks in each group over ``dims``.

        Examples:
            >>> HyperCommGrid([2, 2, 2], ["tp", "cp", "dp"]).group_size(["tp", "dp"])
            4
        """
        return self.layout.group_size(dims)

    def src_rank(self, dims: Dims, rank: int | None = None) -> int:
        """The global rank of group rank 0 in ``rank``'s group over ``dims`` (ezpz's "src rank").

        Examples:
            >>> HyperCommGrid([2, 2, 2], ["tp", "cp", "dp"]).src_rank("dp", rank=7)
            3
        """
        return self.layout.group_ranks(dims, self._rank(rank))[0]

    def shift(
        self, dim: str, disp: int = 1, periodic: bool = False, rank: int | None = None
    ) -> tuple[int | None, int | None]:
        """``(source, dest)`` along ``dim`` like ``MPI_Cart_shift``; None at open edges.

        Examples:
            >>> HyperCommGrid([2, 4], ["tp", "pp"]).shift("pp", rank=3)
            (1, 5)
        """
        return self.layout.shift(dim, self._rank(rank), disp, periodic)

    def is_first(self, dim: str, rank: int | None = None) -> bool:
        """Whether ``rank`` has coordinate 0 along ``dim`` (first pipeline stage for ``"pp"``).

        Examples:
            >>> HyperCommGrid([2, 4], ["tp", "pp"]).is_first("pp", rank=1)
            True
        """
        return self.layout.shift(dim, self._rank(rank))[0] is None

    def is_last(self, dim: str, rank: int | None = None) -> bool:
        """Whether ``rank`` has the last coordinate along ``dim``.

        Examples:
            >>> HyperCommGrid([2, 4], ["tp", "pp"]).is_last("pp", rank=7)
            True
        """
        return self.layout.shift(dim, self._rank(rank))[1] is None

    def rank_repr(
        self, rank: int | None = None, omit: Sequence[str] = (), inner_sep: str = "_", outer_sep: str = "-"
    ) -> str:
        """A checkpoint-friendly name from ``rank``'s coordinates, outermost dim first.

        Examples:
            >>> HyperCommGrid([2, 2, 2], ["tp", "pp", "dp"]).rank_repr(5, omit=["dp"])
            'pp_00-tp_01'
        """
        return self.layout.rank_repr(self._rank(rank), omit, inner_sep, outer_sep)

    # -- views: other factorizations of the same ranks -----------------------

    def view(
        self, shape: Sequence[int], dim_names: Sequence[str], shared_dims: Sequence[str] | None = None
    ) -> HyperCommGrid:
        """Another factorization of the same ranks (MoE parallel folding), sharing groups where dims are shared.

        ``shared_dims`` (default: the names the two grids have in common) must
        enumerate identical groups in both; a family over shared dims only is the
        same process group object in both grids. The view has this grid's
        offset, backend, strategy and guard.

        Raises:
            GridSpecError: the view covers another number of ranks, a shared dim
                is missing from one grid, or enumerates other groups in the view.

        Examples:
            >>> dense = HyperCommGrid([2, 2, 2], ["tp", "dp", "pp"])
            >>> expert = dense.view([4, 1, 2], ["ep", "edp", "pp"])
            >>> expert.shared_dims, expert.get_rank_enum("ep")
            (('pp',), [[0, 1, 2, 3], [4, 5, 6, 7]])
        """
        view = HyperCommGrid(
            shape,
            dim_names,
            self.rank_offset,
            self.backend,
            strategy=self.strategy,
            guard=self.guard,
            guard_timeout_s=self.guard_timeout_s,
        )
        if view.size != self.size:
            raise GridSpecError(
                f"a view must cover the same {self.size} ranks as the grid {self.shape}; "
                f"shape {view.shape} has {view.size}"
            )
        common = [name for name in view.dim_names if name in self.dim_names]
        shared = common if shared_dims is None else list(shared_dims)
        for name in shared:
            if name not in self.dim_names or name not in view.dim_names:
                raise GridSpecError(
                    f"shared dim {name!r} must be a dim of both the grid {self.dim_names} and the view {view.dim_names}"
                )
            if sorted(self.layout.rank_enum(name)) != sorted(view.layout.rank_enum(name)):
                raise GridSpecError(
                    f"shared dim {name!r} enumerates other groups in the view {view.shape} {view.dim_names} "
                    f"than in the grid {self.shape} {self.dim_names}: {view.layout.rank_enum(name)[:2]}... "
                    f"versus {self.layout.rank_enum(name)[:2]}..."
                )
        view._parent = self
        view.shared_dims = tuple(shared)
        return view

    # -- node awareness ----------------------------------------------------------

    def node_report(self, ranks_per_node: int | None = None) -> list[dict[str, Any]]:
        """For each family, how many nodes its groups span (``ranks_per_node`` from ``LOCAL_WORLD_SIZE``).

        Examples:
            >>> [r["intra_node"] for r in HyperCommGrid([4, 2], ["tp", "dp"]).node_report(4)]
            [True, False, False]
        """
        return self.layout.node_report(_ranks_per_node(ranks_per_node))

    def node_ranks(self, rank: int | None = None, ranks_per_node: int | None = None) -> list[int]:
        """The ranks on ``rank``'s node (consecutive blocks of ``ranks_per_node`` global ranks).

        Examples:
            >>> HyperCommGrid([4, 2], ["tp", "dp"]).node_ranks(rank=5, ranks_per_node=4)
            [4, 5, 6, 7]
        """
        per_node = _ranks_per_node(ranks_per_node)
        first = self._rank(rank) // per_node * per_node
        return list(range(first, first + per_node))

    def check_local_rank(self, ranks_per_node: int | None = None) -> None:
        """Check that ``LOCAL_RANK`` is this process's position on its node (nanotron's assert).

        Raises:
            WorldSizeError: ``LOCAL_RANK`` is missing, or not ``rank % ranks_per_node``:
                the launcher placed ranks differently than the layout assumes.
        """
        per_node = _ranks_per_node(ranks_per_node)
        rank = self._rank(None)
        local = os.environ.get("LOCAL_RANK")
        if local is None or local.strip() != str(rank % per_node):
            raise WorldSizeError(
                f"LOCAL_RANK={local!r} on rank {rank}, but with {per_node} consecutive ranks per node it "
                f"should be {rank % per_node}: the launcher placed ranks differently than the grid assumes"
            )

    # -- DeviceMesh ----------------------------------------------------------

    def to_device_mesh(self, dims: Dims, device_type: str = "cpu") -> Any:
        """A torch ``DeviceMesh`` over ``dims`` whose process groups are this grid's (no second set).

        Mesh dims come in the order given (``["dp", "tp"]``: dp outer, tp inner,
        as ``init_device_mesh`` would take them). **Collective** on first use of
        each dim's family (through :meth:`pg`). The caller must be in the grid.
        """
        from torch.distributed.device_mesh import DeviceMesh

        names = list(dims.split(KEY_SEPARATOR)) if isinstance(dims, str) else list(dims)
        self.layout.dim_indices(names)  # validates: known, distinct, non-empty
        rank = self._rank(None)
        if not self.layout.contains(rank):
            raise WorldSizeError(f"rank {rank} is outside the grid {self.shape} (offset {self.rank_offset})")
        groups = [group for group in (self.pg(name) for name in names) if group is not None]
        coord = self.layout.coord_of(rank)._asdict()
        shape = [self.layout.dim_size(name) for name in names]
        points = itertools.product(*(range(size) for size in shape))
        mesh = [self.layout.rank_at(**{**coord, **dict(zip(names, point))}) for point in points]
        tensor = torch.tensor(mesh, dtype=torch.int).reshape(shape)
        return DeviceMesh.from_group(groups, device_type, mesh=tensor, mesh_dim_names=tuple(names))


def _ranks_per_node(ranks_per_node: int | None) -> int:
    if ranks_per_node is None:
        value = os.environ.get("LOCAL_WORLD_SIZE")
        if value is None:
            raise WorldSizeError("ranks_per_node not given and LOCAL_WORLD_SIZE is not set")
        try:
            ranks_per_node = int(value)
        except ValueError:
            raise WorldSizeError(f"LOCAL_WORLD_SIZE={value!r} is not an int") from None
    if isinstance(ranks_per_node, bool) or not isinstance(ranks_per_node, int) or ranks_per_node < 1:
        raise WorldSizeError(f"ranks_per_node must be a positive int, got {ranks_per_node!r}")
    return ranks_per_node
