"""Tiers of a cluster's interconnect and the `Topology` that stacks them, innermost first.

Pure: no torch import. Figures of the presets are documented, with sources, in
`docs/planner.md`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hypergrid.errors import InvalidArgumentError, public_methods
from hypergrid.layout import MAX_WORLD_SIZE
from hypergrid.values import as_number, is_int, shown

__all__ = ["PRESETS", "Tier", "Topology"]


def _positive_number(value: object, what: str) -> float:
    number = as_number(value)
    if number is None or number <= 0:
        raise InvalidArgumentError(f"{what} must be a positive finite number (a float can hold it), got {shown(value)}")
    return number


@public_methods
@dataclass(frozen=True)
class Tier:
    """One level of the interconnect: units of the tier below, joined by links of one speed.

    Args:
        name: a label such as ``"nvlink"`` or ``"ib"``.
        size: how many units of the tier below one unit of this tier holds (ranks,
            for the innermost tier); ``None`` for the outermost, unbounded tier.
        bandwidth: bytes/s per rank over this tier's links: the bus bandwidth one rank
            reaches when every rank of its unit uses the tier at once (nccl-tests' busbw).
        latency: seconds per algorithm step (one message hop) over this tier.

    Raises:
        InvalidArgumentError: a name that is not a non-empty str, a size that is not an
            int from 1 to 2**31-1 or ``None``, a bandwidth or latency that is not a
            positive number a float can hold.

    Examples:
        >>> Tier("nvlink", 8, 370e9, 3e-6)
        Tier(name='nvlink', size=8, bandwidth=370000000000.0, latency=3e-06)
    """

    name: str
    size: int | None
    bandwidth: float
    latency: float

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise InvalidArgumentError(f"a tier's name must be a non-empty str, got {shown(self.name)}")
        if self.size is not None and (not is_int(self.size) or not 1 <= self.size <= MAX_WORLD_SIZE):
            raise InvalidArgumentError(
                f"tier {shown(self.name)}: size must be an int from 1 to 2**31-1 (the largest world), or None for the "
                f"outermost tier; got {shown(self.size)}"
            )
        object.__setattr__(self, "size", None if self.size is None else int(self.size))
        object.__setattr__(self, "bandwidth", _positive_number(self.bandwidth, f"tier {shown(self.name)}: bandwidth"))
        object.__setattr__(self, "latency", _positive_number(self.latency, f"tier {shown(self.name)}: latency"))


#: Named clusters: tiers innermost first (figures and sources in docs/planner.md).
PRESETS: dict[str, tuple[Tier, ...]] = {
    # 8 H100 per node over NVLink 4 (nccl-tests all_reduce busbw ~370 GB/s), then one
    # 400 Gb/s InfiniBand NDR NIC per GPU (~47 GB/s busbw per NIC).
    "h100_8x": (Tier("nvlink", 8, 370e9, 3e-6), Tier("ib", None, 47e9, 8e-6)),
    # GB200 NVL72: 72 GPUs in one NVLink 5 domain (900 GB/s per direction per GPU,
    # ~82% achievable as on H100), then one 400 Gb/s NIC per GPU.
    "gb200_nvl72": (Tier("nvlink", 72, 740e9, 4e-6), Tier("ib", None, 47e9, 8e-6)),
}


@public_methods
@dataclass(frozen=True, init=False)
class Topology:
    """The tiers of a cluster, innermost first; the outermost has ``size=None``.

    Args:
        tiers: one or more `Tier`; every tier but the last needs an int ``size``,
            the last needs ``size=None``; names must differ.

    Raises:
        InvalidArgumentError: no tiers, a non-`Tier`, a bounded outermost tier, an
            unbounded inner tier, or a repeated name.

    Examples:
        >>> topo = Topology([Tier("node", 4, 100e9, 1e-6), Tier("net", None, 10e9, 1e-5)])
        >>> topo.unit_ranks, topo.names
        ((4,), ('node', 'net'))
    """

    tiers: tuple[Tier, ...]

    def __init__(self, tiers: Sequence[Tier]) -> None:
        if isinstance(tiers, (str, bytes)) or not isinstance(tiers, Sequence) or not tiers:
            raise InvalidArgumentError(f"tiers must be a non-empty list of Tier, innermost first, got {shown(tiers)}")
        for tier in tiers:
            if not isinstance(tier, Tier):
                raise InvalidArgumentError(f"tiers must hold Tier objects, got {shown(tier)}")
        *inner, outer = tiers
        for tier in inner:
            if tier.size is None:
                raise InvalidArgumentError(
                    f"tier {shown(tier.name)} has size None but is not the outermost tier; only the last tier "
                    f"is unbounded"
                )
        if outer.size is not None:
            raise InvalidArgumentError(
                f"the outermost tier {shown(outer.name)} must have size None (unbounded), got size {shown(outer.size)}"
            )
        names = [tier.name for tier in tiers]
        if len(set(names)) != len(names):
            raise InvalidArgumentError(f"tier names must differ, got {names}")
        object.__setattr__(self, "tiers", tuple(tiers))

    @classmethod
    def preset(cls, name: str) -> Topology:
        """A named cluster: ``"h100_8x"`` or ``"gb200_nvl72"``.

        Raises:
            InvalidArgumentError: an unknown name (the message lists the known ones).

        Examples:
            >>> Topology.preset("h100_8x").unit_ranks
            (8,)
        """
        if not isinstance(name, str) or name not in PRESETS:
            raise InvalidArgumentError(f"unknown topology preset {shown(name)}; known presets are {sorted(PRESETS)}")
        return cls(PRESETS[name])

    @property
    def names(self) -> tuple[str, ...]:
        """The tier names, innermost first."""
        return tuple(tier.name for tier in self.tiers)

    @property
    def unit_ranks(self) -> tuple[int, ...]:
        """Ranks in one unit of each bounded tier, innermost first (8 for an 8-GPU node)."""
        ranks, out = 1, []
        for tier in self.tiers[:-1]:
            ranks *= tier.size or 1
            out.append(ranks)
        return tuple(out)

    @property
    def fastest_bandwidth(self) -> float:
        """The largest tier bandwidth: the bus bound no collective is priced below."""
        return max(tier.bandwidth for tier in self.tiers)

    def replace(self, **tiers: Mapping[str, float]) -> Topology:
        """A copy with some tiers' ``bandwidth``/``latency`` replaced, by tier name.

        Examples:
            >>> Topology.preset("h100_8x").replace(ib={"bandwidth": 20e9}).tiers[1].bandwidth
            20000000000.0
        """
        unknown = sorted(set(tiers) - set(self.names))
        if unknown:
            raise InvalidArgumentError(f"unknown tier(s) {unknown}; this topology's tiers are {list(self.names)}")
        new = []
        for tier in self.tiers:
            fields: dict[str, Any] = {"bandwidth": tier.bandwidth, "latency": tier.latency, **tiers.get(tier.name, {})}
            new.append(Tier(tier.name, tier.size, fields["bandwidth"], fields["latency"]))
        return Topology(new)

    def calibrate(self, results: Any, sizes: Mapping[str, int]) -> Topology:
        """Fit tier bandwidths and latencies from the JSON rows of ``benchmarks/allreduce.py``.

        See `hypergrid.cluster.calibrate.calibrate` (same arguments, this topology as ``base``).

        Examples:
            >>> Topology.preset("h100_8x").calibrate([], {"tp": 8}).tiers[0].bandwidth
            370000000000.0
        """
        from hypergrid.cluster.calibrate import calibrate

        fitted: Topology = calibrate(self, results, sizes)
        return fitted

    def to_dict(self) -> dict[str, Any]:
        """Plain data (for JSON output).

        Examples:
            >>> Topology.preset("h100_8x").to_dict()["tiers"][0]["name"]
            'nvlink'
        """
        return {"tiers": [dict(vars(tier)) for tier in self.tiers]}
