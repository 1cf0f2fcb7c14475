"""``HyperCommGrid``: the torch.distributed binding over ``GridLayout``.

The API follows Megatron-Core's ``HyperCommGrid``: a grid is planned offline
(no process group needed), and the process groups of a combination of dims are
created only when ``HyperCommGrid.create_pg`` is called, collectively over
the default group, through ``torch.distributed.new_subgroups_by_enumeration``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch.distributed as dist

from hypergrid.binding.creation import check_strategy
from hypergrid.binding.options import check_group_options, normalize_backend, refuse_keywords
from hypergrid.binding.registry import PgKey, for_view, member_or_none
from hypergrid.binding.worldsize import world_size_hint
from hypergrid.errors import GroupNotFoundError
from hypergrid.grid.batch import create_families
from hypergrid.grid.core import GridCore, RankView, check_fits
from hypergrid.grid.elastic import check_spares
from hypergrid.grid.front import FacetFront
from hypergrid.layout import Dims, GridLayout, resolve_shape
from hypergrid.layout.shrink import check_replicas
from hypergrid.ops.collectives import check_collectives_flag
from hypergrid.validation import check_bool, check_timeout, public_methods
from hypergrid.values import is_int, shown

__all__ = ["HyperCommGrid", "world_size_hint"]


@public_methods
class HyperCommGrid(FacetFront):
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
            ``hypergrid.binding.creation``. ``create_pg`` can override it per call.
        guard: check, before each creation, that every participating rank asks
            for the same family of the same grid at the same point (see
            ``hypergrid.agreement.guard``); a mismatch or a missing rank raises on all
            of them instead of hanging. On by default.
        guard_timeout_s: how long the guard waits for the other ranks.
        guard_progress_s: while the guard waits, a warning on the ``"hypergrid"``
            logger every this many seconds (the first after
            ``min(guard_progress_s, guard_timeout_s / 4)``) names how many ranks
            arrived; silence it with
            ``logging.getLogger("hypergrid").setLevel(logging.ERROR)``.
        share_groups: families (of this grid and its views) whose groups have
            the same members, backend, options and tag share one process group
            object (see ``communicators()``); ``False`` creates one group per
            family, as Megatron does.
        group_options: defaults for every family and view: ``timeout``,
            ``pg_options``, ``group_desc`` (passed to torch); a ``create_pg``
            keyword overrides them for one family.
        spares: the last ``spares`` ranks of the world stay outside the grid, in
            ``standby``, to take a dead rank's place (see ``shrink``, docs/elastic.md). A ``-1`` dim takes
            the world less the spares; with spares the world must be the grid plus its spares.
        replicas: the replica dims, whose every slice holds a whole copy of the model: the only dims ``shrink``
            and ``grow`` drop or fill slices of (a dim name or a list; ``None``: ``dp`` where the grid has one).
        check_collectives: compare collectives' calls first (hypergrid.ops.checks); None: HYPERGRID_CHECK_COLLECTIVES.

    Raises:
        GridSpecError: invalid shape, names or offset, or ranks left between the grid and its spares.
        GridTooLargeError: (a ``WorldSizeError`` and a ``RuntimeError``, as Megatron
            raises) ``rank_offset + size`` exceeds the known world size.
        BackendError: ``backend`` is not None or a backend name.
        InvalidArgumentError: unknown ``strategy``, a bad ``guard_timeout_s``,
            ``guard_progress_s`` or ``share_groups``, or a bad value in ``group_options``; ``replicas`` naming
            a dim the grid lacks; spares on a grid whose every replica dim has size 1 (no replica to copy from).
        UnexpectedArgumentError: an unknown name in ``group_options``.

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
        share_groups: bool = True,
        group_options: Mapping[str, Any] | None = None,
        spares: int = 0,
        check_collectives: bool | None = None,
        replicas: str | Sequence[str] | None = None,
    ) -> None:
        world = world_size_hint()
        reserved = spares if is_int(spares) and 0 < spares < (world or 0) else 0  # (checked below)
        self.layout = GridLayout(resolve_shape(shape, world and world - reserved, rank_offset), dim_names, rank_offset)
        self.backend = normalize_backend(backend, "backend")
        self.strategy = check_strategy(strategy)
        self.guard = check_bool("HyperCommGrid", "guard", guard)
        self.guard_timeout_s = check_timeout(guard_timeout_s, "guard_timeout_s")
        self.guard_progress_s = check_timeout(guard_progress_s, "guard_progress_s")
        self.share_groups = check_bool("HyperCommGrid", "share_groups", share_groups)
        self.group_options = check_group_options(group_options)
        self.check_collectives = check_collectives_flag(check_collectives)
        check_fits(self, world)
        self.spares = check_spares(spares, world, self.rank_offset + self.size)
        self.replicas = check_replicas(replicas, self.dim_names, self.shape, self.spares)
        # All of the grid's state: its registry (shared with its views), views, pool and guard ledgers.
        self._core: GridCore = GridCore(self, self.layout)  # the facets see it as a FacetCore
        FacetFront.__init__(self, self._core)  # the facet objects over it, which FacetFront's methods delegate to

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

    @property
    def shared_dims(self) -> tuple[str, ...]:
        """The dims whose groups this grid takes from its root grid (empty for a root grid)."""
        return tuple(self._core.registry.views[self._core.view_name].shared_dims)

    @property
    def _pgs(self) -> dict[PgKey, Any]:
        """The registry, under Megatron-Core's name and keys (``"dp-tp"``, ``("expert", ("ep", "expt_tp"))``).

        Reading or replacing it (as Megatron's code does) reads or replaces the root's registry.
        """
        return self._core.registry.groups

    @_pgs.setter
    def _pgs(self, value: dict[PgKey, Any]) -> None:
        self._core.registry.groups = value

    @property
    def _views(self) -> dict[str, RankView]:
        """The registered views by name, ``"base"`` included, under Megatron-Core's name (shared with the root)."""
        return self._core.registry.views

    def __repr__(self) -> str:
        return (
            f"HyperCommGrid(shape={self.shape}, dim_names={self.dim_names}, "
            f"rank_offset={self.rank_offset}, backend={shown(self.backend)}, groups={self.created_keys})"
        )

    # -- groups -------------------------------------------------------------

    def get_rank_enum(self, dims: Dims, *, view: str | None = None) -> list[list[int]]:
        """The ranks of every group of the family over ``dims`` (pure, no torch call).

        Exactly what ``create_pg`` passes to ``new_subgroups_by_enumeration``;
        dims in any order give the same result. ``view`` names a registered view
        (``register_view``); default: this grid's own.

        Raises:
            DimsError: unknown, repeated or no dims.
            ViewNotFoundError: (a ``KeyError``) ``view`` is not registered.

        Examples:
            >>> HyperCommGrid([2, 2, 2], ["a", "b", "c"]).get_rank_enum(["b", "a"])
            [[0, 1, 2, 3], [4, 5, 6, 7]]
        """
        _, _, spec = self._core.family(dims, view)
        return spec.layout.rank_enum(dims)

    def create_pg(
        self,
        dims: Dims,
        *,
        view: str | None = None,
        strategy: str | None = None,
        tag: str | None = None,
        **kwargs: Any,
    ) -> dist.ProcessGroup | None:
        """Create the process groups of the family over ``dims``; return the caller's.

        Collective: with strategies ``"enumerate"`` and ``"split"`` every rank
        of the default group must call it, for the same dims, in the same
        order; with ``"local"`` the members of each group must. A view's family
        over its shared dims only is the base grid's (created once, under the
        base key). With ``share_groups`` on, a family whose groups have the
        same members, backend, options and tag as one created before gets that
        group object and creates nothing; the guard checks the request all the
        same (``docs/communicators.md``). ``within="node"`` / ``across="node"``
        create one half of the family's hierarchy instead (key
        ``"dp-tp|within=node"``; ``docs/hierarchy.md``).

        Args:
            dims: the family's dims, in any order.
            view: a registered view's name (default: this grid's).
            strategy: how to create it (default: the grid's).
            tag: a short identifier for a separate communicator over the same
                family; it never shares with an untagged group.
            **kwargs: ``timeout``, ``pg_options``, ``group_desc`` (default: the grid's ``group_options``), passed to
                torch; ``backend``, which must agree with the grid's unless ``tag`` is given; ``within``/``across``
                and ``ranks_per_node`` (nodes of that many ranks; default ``LOCAL_WORLD_SIZE``).

        Returns:
            The group holding the calling rank, or ``None`` on ranks outside the grid.

        Raises:
            DimsError: unknown, repeated or no dims.
            GroupExistsError: (a ``KeyError``) this family (with this tag) was already created.
            ViewNotFoundError: (a ``KeyError``) ``view`` is not registered.
            UnexpectedArgumentError: an unknown keyword argument.
            BackendError: ``backend`` conflicts with the grid's on an untagged
                family, or ``"split"`` where the default group cannot split.
            InvalidArgumentError: unknown ``strategy``, a bad ``tag`` or option value.
            NotInitializedError: torch.distributed is not initialized.
            GridTooLargeError: the grid does not fit in the world.
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
            >>> grid.get_pg("tp-dp") is group, grid.create_pg("dp") is group, grid.create_pg("dp", tag="ag") is group
            (True, True, False)
            >>> grid.created_keys
            ['dp-tp', 'dp', 'dp@ag']
            >>> grid.destroy()
            >>> dist.destroy_process_group()
        """
        return next(iter(create_families(self._core, [dims], view, strategy, tag, kwargs, "create_pg").values()))

    def pg(
        self,
        dims: Dims,
        *,
        view: str | None = None,
        tag: str | None = None,
        within: str | None = None,
        across: str | None = None,
        **kwargs: Any,
    ) -> dist.ProcessGroup | None:
        """The caller's group over ``dims`` (with ``tag``, if given), created on first use.

        **Collective on first use** (it calls ``create_pg``, with the same
        rules): every rank that takes part must call it for the same dims in the
        same order. With the guard on (the default) a rank that asks for
        something else makes every participant raise ``DesyncError`` instead of
        hanging. Later calls are local lookups; keyword arguments are used only
        on the creating call. ``view``, ``within`` and ``across`` as in ``create_pg``.

        Examples:
            >>> import torch.distributed as dist
            >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
            >>> grid = HyperCommGrid([1], ["dp"])
            >>> grid.pg("dp") is grid.pg("dp") is grid.get_pg("dp")
            True
            >>> grid.pg("dp", tag="ag") is grid.get_pg("dp", tag="ag")
            True
            >>> grid.destroy(); dist.destroy_process_group()
        """
        key = self._core.key(dims, view, tag, within, across)
        if key in self._core.registry.groups:
            self._core.node_size_of(key, kwargs.get("ranks_per_node"), within or across)
            return member_or_none(self._core.registry.groups[key])
        return self.create_pg(dims, view=view, tag=tag, within=within, across=across, **kwargs)

    def get_pg(
        self,
        dims: Dims,
        *,
        view: str | None = None,
        tag: str | None = None,
        within: str | None = None,
        across: str | None = None,
        **kwargs: Any,
    ) -> dist.ProcessGroup | None:
        """The caller's group of an already created family (a local lookup), with ``tag`` if given.

        Returns ``None`` on ranks outside the grid (also where the registry holds
        torch's ``GroupMember.NON_GROUP_MEMBER``). ``view``, ``within`` and
        ``across`` as in ``create_pg``.

        Raises:
            DimsError: unknown, repeated or no dims.
            GroupNotFoundError: (a ``KeyError``) the family (with this tag) was not created yet.
            ViewNotFoundError: (a ``KeyError``) ``view`` is not registered.
            InvalidArgumentError: a bad ``tag``, ``within`` or ``across``.
            UnexpectedArgumentError: any other keyword (``ranks_per_node``: give it to ``pg``/``create_pg``).

        Examples:
            >>> HyperCommGrid([2, 2], ["tp", "dp"]).get_pg("tp")  # doctest: +ELLIPSIS
            Traceback (most recent call last):
              ...
            hypergrid.errors.GroupNotFoundError: get_pg: Process group for 'tp' hasn't been created ...
        """
        refuse_keywords("get_pg", kwargs, "creation options (ranks_per_node, timeout, ...) go to pg() or create_pg()")
        key = self._core.key(dims, view, tag, within, across)
        if key not in self._core.registry.groups:
            what = f"for {shown(key)}" if isinstance(key, str) else f"{shown(dims)}{for_view(key)}"
            given = ", ".join(
                f"{k}={shown(v)}" for k, v in {"tag": tag, "within": within, "across": across}.items() if v
            )
            call = f"create_pg(..., {given})" if given else "create_pg"
            raise GroupNotFoundError(
                f"Process group {what} hasn't been created (dims {shown(dims)}, key {shown(key)}); created so far: "
                f"{list(self._core.registry.groups)}; call {call} first"
            )
        return member_or_none(self._core.registry.groups[key])

    @property
    def created_keys(self) -> list[PgKey]:
        """Registry keys of the families created so far, in creation order (``key@tag`` when tagged).

        For a grid returned by ``view()``: its own families, as canonical
        strings of its dims (shared families included).
        """
        return self._core.view_keys(own_only=False)

    def destroy(self) -> None:
        """Release this grid's families on the calling rank; destroy the groups nothing else holds.

        Only groups that hold the caller are destroyed, each once: a group
        shared by several families (or keys) when the last of them is released;
        never torch's ``NON_GROUP_MEMBER`` or the default group. On the root
        grid: every family of every view. On a grid returned by ``view()``:
        only that view's own families (the groups it shares with its root stay).
        Groups that torch has already destroyed (for instance by
        ``destroy_process_group()`` of the default group) are skipped.
        Idempotent; the grid can create its families again afterwards. On the
        root grid it also ends the guard's epoch (when anything was created
        since the last one, or a guard round failed on any grid): called on every rank, it brings ranks that fell out
        of step back in step (docs/reliability.md). Groups placed in ``_pgs``
        from outside (as Megatron's code and tests do) are destroyed too, skipping
        ``None`` and ``NON_GROUP_MEMBER``.

        The root grid's ``destroy()`` also lets go of its world: once no grid of
        this rank holds it, the rank leaves the world's watch (its watcher thread
        and store connection end). Without ``destroy()`` the groups and the watch
        last until ``torch.distributed.destroy_process_group()`` or the process's
        exit, which release them as well. On a grid a shrink replaced it only lets
        go (its groups went with the shrink).
        """
        self._core.drop_families()
        world = self._core.registry.world
        if self._core.root is self and world is not None:
            world.release(self)
