"""Megatron-Core's layout vocabulary on hypergrid: order strings, ``RankGenerator``, the dense grid and its expert view.

Megatron writes ``order="tp-cp-ep-dp-pp"`` with the leftmost dim innermost; that
string split on ``-`` is hypergrid's ``dim_names``. Megatron-Core 0.19 adds a
``gtp_remat`` axis to its rank generators (weight rematerialisation): it goes
right after ``tp`` on the dense side and right after ``ep`` on the expert side
when the order does not name it (``_inject_gtp_remat_axis``), and every dim the
order leaves out (of size 1) is appended in the order tp, pp, dp, ep, cp,
gtp_remat.

Examples:
    >>> grid = grid_from_order("tp-cp-pp-dp", tp=2, cp=3, pp=4, dp=5)
    >>> grid.shape, grid.get_rank_enum("tp")[:2]
    ([2, 3, 4, 5], [[0, 1], [2, 3]])
    >>> RankGenerator(tp=2, ep=1, dp=5, pp=4, cp=3, order="tp-cp-ep-pp-dp").get_ranks("tp-pp")[0]
    [0, 1, 6, 7, 12, 13, 18, 19]
    >>> megatron_tokens("tp-cp-ep-dp-pp", "tp"), megatron_tokens("tp-cp-ep-dp-pp", "ep")
    (['tp', 'gtp_remat', 'cp', 'ep', 'dp', 'pp'], ['tp', 'cp', 'ep', 'gtp_remat', 'dp', 'pp'])
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hypergrid.errors import DimsError, GridSpecError
from hypergrid.grid import HyperCommGrid
from hypergrid.layout import GridLayout
from hypergrid.values import as_int, shown

__all__ = ["RankGenerator", "grid_from_order", "megatron_tokens", "moe_grids"]

#: Megatron's RankGenerator dims, in the order it appends those an order string leaves out.
MEGATRON_DIMS = ("tp", "pp", "dp", "ep", "cp", "gtp_remat")
#: The default order of ``initialize_model_parallel``.
DEFAULT_ORDER = "tp-cp-ep-dp-pp"
#: Dense token -> the expert view's name for it (the expert side has no cp).
EXPERT_NAMES = {"tp": "etp", "dp": "edp", "gtp_remat": "egtp_remat"}


def _order_names(order: str) -> list[str]:
    if not isinstance(order, str) or not order:
        raise DimsError(f"order must be a string like 'tp-cp-ep-dp-pp', got {order!r}")
    return order.lower().split("-")


def megatron_tokens(order: str, after: str) -> list[str]:
    """Megatron's full token list for ``order``: gtp_remat injected after ``after``, missing dims appended.

    ``after`` is ``"tp"`` for the dense generator and ``"ep"`` for the expert
    one (``_inject_gtp_remat_axis``: after ``after`` if the order names it,
    else after ``tp``, else first).

    Raises:
        DimsError: ``order`` is not a string, names an unknown dim or repeats one.

    Examples:
        >>> megatron_tokens("tp-pp-dp", "ep")
        ['tp', 'gtp_remat', 'pp', 'dp', 'ep', 'cp']
    """
    tokens = _order_names(order)
    unknown = sorted(set(tokens) - set(MEGATRON_DIMS))
    if unknown:
        raise DimsError(f"order {order!r} names {unknown}; Megatron's dims are {list(MEGATRON_DIMS)}")
    if len(set(tokens)) != len(tokens):
        raise DimsError(f"order {order!r} repeats a dim")
    if "gtp_remat" not in tokens:
        anchor = after if after in tokens else "tp"
        tokens.insert(tokens.index(anchor) + 1 if anchor in tokens else 0, "gtp_remat")
    return tokens + [name for name in MEGATRON_DIMS if name not in tokens]


def grid_from_order(
    order: str,
    sizes: Mapping[str, int] | None = None,
    *,
    rank_offset: int = 0,
    backend: str | None = None,
    **size_kwargs: int,
) -> HyperCommGrid:
    """A grid from a Megatron order string and sizes; a missing size is inferred from the world (-1).

    Examples:
        >>> grid_from_order("tp-dp", {"tp": 2, "dp": 4}).get_rank_enum("dp")[0]
        [0, 2, 4, 6]
    """
    given = {**(sizes or {}), **size_kwargs}
    names = _order_names(order)
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise DimsError(f"sizes given for {unknown}, which order {order!r} does not name")
    return HyperCommGrid([given.get(name, -1) for name in names], names, rank_offset, backend)


class RankGenerator:
    """Megatron's ``RankGenerator(tp, ep, dp, pp, cp, order, rank_offset, gtp_remat)``; ``get_ranks(token)``.

    Dims of size 1 may be left out of ``order`` (appended as Megatron does); a
    dim larger than 1 must be in it. No dim is injected: that is
    ``initialize_model_parallel``'s step (``megatron_tokens``).
    """

    def __init__(
        self, tp: int, ep: int, dp: int, pp: int, cp: int, order: str, rank_offset: int = 0, gtp_remat: int = 1
    ) -> None:
        sizes = {"tp": tp, "pp": pp, "dp": dp, "ep": ep, "cp": cp, "gtp_remat": gtp_remat}
        names = _order_names(order)
        unknown = sorted(set(names) - set(MEGATRON_DIMS))
        if unknown:
            raise DimsError(f"order {order!r} names {unknown}; Megatron's dims are {list(MEGATRON_DIMS)}")
        for name, size in sizes.items():
            if name not in names:
                if size != 1:
                    raise GridSpecError(f"{name}={size} but order {order!r} leaves {name!r} out")
                names.append(name)
        self.order = "-".join(names)
        self.layout = GridLayout([sizes[name] for name in names], names, rank_offset)
        self.world_size = self.layout.size

    def get_ranks(self, token: str) -> list[list[int]]:
        """The groups over the dims in ``token`` (e.g. ``"tp-pp"``), Megatron's order."""
        return self.layout.rank_enum(token)


def positive(name: str, value: object) -> int:
    """``value`` as an int when it is a positive integer, else ``GridSpecError`` naming ``name``."""
    number = as_int(value)
    if number is None or number < 1:
        raise GridSpecError(f"{name} must be a positive int, got {shown(value)}")
    return number


def dense_and_expert(
    *,
    tp: int,
    pp: int,
    cp: int,
    ep: int,
    etp: int,
    order: str,
    gtp_remat: int,
    egtp_remat: int,
    unit_gtp: bool,
) -> tuple[list[str], dict[str, int], list[str], dict[str, int]]:
    """The dense grid's names and sizes (``dp`` -1: inferred) and the expert view's names and known sizes.

    Dense: Megatron's dense tokens without ``ep``; expert: its expert tokens
    without ``cp``, renamed ``etp``, ``egtp_remat``, ``edp``. With ``unit_gtp``
    off, only the order's own dims, ``dp`` and a gtp_remat dim larger than 1 are
    kept (``moe_grids``' grids, as they always were); with it on, every dim.
    """
    sizes = {"tp": tp, "pp": pp, "cp": cp, "ep": ep, "etp": etp, "gtp_remat": gtp_remat, "egtp_remat": egtp_remat}
    sizes = {name: positive(name, value) for name, value in sizes.items()}
    tokens = _order_names(order)
    missing = sorted(name for name in ("tp", "cp", "ep", "pp") if name not in tokens and sizes[name] > 1)
    if missing:
        raise GridSpecError(f"order {order!r} leaves out {missing}, whose sizes are larger than 1")

    def kept(name: str, gtp: int) -> bool:  # moe_grids' grids: the order's own dims, dp, a gtp_remat larger than 1
        return unit_gtp or name in tokens or name == "dp" or (name == "gtp_remat" and gtp > 1)

    dense = [name for name in megatron_tokens(order, "tp") if name != "ep" and kept(name, gtp_remat)]
    expert = [
        EXPERT_NAMES.get(name, name) for name in megatron_tokens(order, "ep") if name != "cp" and kept(name, egtp_remat)
    ]
    dense_sizes = {"tp": sizes["tp"], "gtp_remat": gtp_remat, "cp": sizes["cp"], "dp": -1, "pp": sizes["pp"]}
    expert_sizes = {"etp": sizes["etp"], "ep": sizes["ep"], "egtp_remat": egtp_remat, "pp": sizes["pp"]}
    return dense, dense_sizes, expert, expert_sizes


def build_grids(
    *,
    tp: int,
    pp: int,
    cp: int,
    ep: int,
    etp: int,
    dp: int | None,
    order: str,
    gtp_remat: int,
    egtp_remat: int,
    unit_gtp: bool,
    rank_offset: int,
    backend: str | None,
    options: Mapping[str, Any],
    view_name: str | None,
) -> tuple[HyperCommGrid, HyperCommGrid]:
    """The dense grid and its expert view (registered as ``view_name``), Megatron's checks first."""
    dense_names, dense_sizes, expert_names, expert_sizes = dense_and_expert(
        tp=tp, pp=pp, cp=cp, ep=ep, etp=etp, order=order, gtp_remat=gtp_remat, egtp_remat=egtp_remat, unit_gtp=unit_gtp
    )
    if dp is not None:
        dense_sizes["dp"] = positive("dp", dp)
    dense = HyperCommGrid([dense_sizes[name] for name in dense_names], dense_names, rank_offset, backend, **options)
    expert_size = expert_sizes["etp"] * expert_sizes["ep"] * expert_sizes["egtp_remat"] * expert_sizes["pp"]
    if dense.size % expert_size:
        raise GridSpecError(
            f"etp*ep*egtp_remat*pp = {expert_size} does not divide the {dense.size} ranks of the dense grid "
            f"{dense.shape} {dense.dim_names}"
        )
    expert_sizes["edp"] = dense.size // expert_size
    dp_size = dense.layout.dim_size("dp")
    if not _order_names(order)[-1] == "pp" and expert_sizes["pp"] > 1 and expert_sizes["edp"] != dp_size:
        raise GridSpecError(
            f"order {order!r} does not end with pp, so the expert data-parallel size ({expert_sizes['edp']}) must "
            f"equal the dense one ({dp_size}), as Megatron-Core requires"
        )
    shape = [expert_sizes[name] for name in expert_names]
    return dense, dense.view(shape, expert_names, ["pp"], name=view_name)


def moe_grids(
    *,
    tp: int,
    pp: int,
    etp: int,
    ep: int,
    cp: int = 1,
    order: str = DEFAULT_ORDER,
    rank_offset: int = 0,
    backend: str | None = None,
    gtp_remat: int = 1,
    egtp_remat: int = 1,
    **options: Any,
) -> tuple[HyperCommGrid, HyperCommGrid]:
    """The dense grid (tp, cp, dp, pp) and the expert view (etp, ep, edp, pp) over the same ranks.

    MoE parallel folding: dp and edp are inferred from the world; pp is shared,
    so the pipeline groups are the same process group objects in both. A
    ``gtp_remat`` (``egtp_remat``) larger than 1 adds that dim where Megatron
    puts it: after tp (after ep in the expert view).

    Examples:
        >>> import os
        >>> os.environ["WORLD_SIZE"] = "16"
        >>> dense, expert = moe_grids(tp=2, pp=2, etp=1, ep=4)
        >>> dense.shape, dense.dim_names, expert.shape, expert.dim_names
        ([2, 1, 4, 2], ['tp', 'cp', 'dp', 'pp'], [1, 4, 2, 2], ['etp', 'ep', 'edp', 'pp'])
        >>> del os.environ["WORLD_SIZE"]
    """
    return build_grids(
        tp=tp,
        pp=pp,
        cp=cp,
        ep=ep,
        etp=etp,
        dp=None,
        order=order,
        gtp_remat=gtp_remat,
        egtp_remat=egtp_remat,
        unit_gtp=False,
        rank_offset=rank_offset,
        backend=backend,
        options=options,
        view_name=None,
    )
