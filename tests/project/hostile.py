"""Hostile values into every public entry point: the table the property test walks, and a counter.

Every callable of the public surface (``tests/project/public_surface.json``)
gets a valid baseline call; one argument at a time is replaced by a hostile
value (an int too long to print, NaN, bytes, an object, a lambda, a nested
list, a 300-character string with a newline, ...). The promise (issue 25,
item 1): a ``HyperGridError`` whose message is one line naming the call, and
no torch call made (no communication, no group, no process, no store).

``python -m tests.project.hostile`` counts the outcomes over the whole table
(``--failures`` lists what is not clean); it runs against whatever
``hypergrid`` is importable, so the same table measures before and after.
"""

from __future__ import annotations

import contextlib
import inspect
import re
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

#: Hostile values by label. None of them is a valid value for any argument, except where an entry says so.
HOSTILE: dict[str, Any] = {
    "huge int": 10**5000,
    "huge negative int": -(10**5000),
    "2**63": 2**63,
    "nan": float("nan"),
    "inf": float("inf"),
    "complex": 3j,
    "bytes": b"\xff\x00",
    "object": object(),
    "lambda": lambda: None,
    "list of a huge int": [10**5000],
    "nested list": [[[[object()]]]],
    "dict": {"key": object()},
    "set": {1, 2},
    "long string": "x" * 300 + "\n",
    "empty string": "",
    "bool": True,
    "negative": -7,
    "tensor": torch.ones(2),
    "numpy array": np.zeros((2, 2)),
}

#: Labels valid for any int-like argument that takes any int (a displacement), for any str, and so on.
INTS = {"huge int", "huge negative int", "2**63", "negative"}
STRINGS = {"long string", "empty string"}


@dataclass
class Entry:
    """One public callable: how to call it validly, and which arguments to make hostile.

    Attributes:
        name: the surface name (``HyperCommGrid.all_reduce``).
        call: the name its errors must give (``all_reduce``).
        target: a function returning the callable (fresh objects each time).
        kwargs: the valid baseline, by parameter name (positional-only ones by name too; see ``positional``).
        skip: per parameter, the hostile labels that are valid values there.
        positional: parameters passed positionally, in order (positional-only ones).
        owner: who owns the code (``compat`` is another helper's).
        pending: parameters whose checks live in code another owner keeps, with that owner.
    """

    name: str
    call: str
    target: Callable[[], Callable[..., Any]]
    kwargs: dict[str, Any]
    skip: dict[str, set[str]] = field(default_factory=dict)
    positional: tuple[str, ...] = ()
    owner: str = "core"
    pending: dict[str, str] = field(default_factory=dict)

    def invoke(self, parameter: str, value: Any) -> Any:
        arguments = {**self.kwargs, parameter: value}
        args = [arguments.pop(name) for name in self.positional]
        return self.target()(*args, **arguments)


class TorchCalled(Exception):
    """Raised by the stand-ins for torch's communication entry points: the call reached torch."""


_COMMUNICATION = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_single",
    "all_gather_object",
    "reduce_scatter_tensor",
    "reduce_scatter_single",
    "broadcast",
    "barrier",
    "batch_isend_irecv",
    "isend",
    "irecv",
    "send",
    "recv",
    "new_group",
    "new_subgroups_by_enumeration",
    "split_group",
    "init_process_group",
)


@contextlib.contextmanager
def no_torch_calls() -> Iterator[list[str]]:
    """Every communication entry point of torch (and the grid's creation step) raises `TorchCalled`."""
    import hypergrid.grid.batch
    import hypergrid.launch.processes
    import hypergrid.ops.checks
    import hypergrid.ops.collectives

    called: list[str] = []

    def stand_in(name: str) -> Callable[..., Any]:
        def refuse(*args: Any, **kwargs: Any) -> Any:
            called.append(name)
            raise TorchCalled(name)

        return refuse

    patches: list[tuple[Any, str, Any]] = []
    for name in _COMMUNICATION:
        if hasattr(dist, name):
            patches.append((dist, name, stand_in(name)))
    patches += [
        (hypergrid.ops.checks, "all_gather_single", stand_in("all_gather_single")),
        (hypergrid.ops.collectives, "_reduce_scatter_single", stand_in("reduce_scatter_single")),
        (hypergrid.grid.batch, "agree", stand_in("guard round")),
        (hypergrid.grid.batch, "create_family", stand_in("create_family")),
        (hypergrid.grid.batch, "create_uninitialized", stand_in("create_family")),
        (hypergrid.launch.processes, "TCPStore", stand_in("TCPStore")),
    ]
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    for owner, name, value in patches:
        setattr(owner, name, value)
    try:
        yield called
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)


def _module_function() -> int:
    return 1


def entries() -> list[Entry]:
    """The table: every public callable with a valid baseline (needs a one-rank world for the grid's)."""
    import hypergrid
    import hypergrid.autograd
    import hypergrid.launch
    import hypergrid.layout
    import hypergrid.topology
    import hypergrid.values
    from hypergrid import GridLayout, HyperCommGrid

    x = torch.ones(4)
    param = torch.nn.Parameter(torch.ones(2))
    param.grad = torch.ones(2)
    grid = HyperCommGrid([1, 1], ["tp", "dp"])
    layout = GridLayout([2, 2], ["tp", "dp"])
    tmp = tempfile.gettempdir()
    tier = hypergrid.topology.Tier("node", 8, 1e11, 1e-6)
    topology = hypergrid.topology.Topology([tier, hypergrid.topology.Tier("net", None, 1e10, 1e-5)])
    span = hypergrid.topology.family_spans([2, 2], ["tp", "dp"], "tp", [8])
    traffic = hypergrid.topology.Traffic("tp", "all_reduce", 1e6)
    sum_op = dist.ReduceOp.SUM
    table: list[Entry] = []

    def method(call: str, kwargs: dict[str, Any], skip: dict[str, set[str]] | None = None, **extra: Any) -> None:
        table.append(Entry(f"HyperCommGrid.{call}", call, lambda: getattr(grid, call), kwargs, skip or {}, **extra))

    method("all_gather", {"tensor": x, "dims": "tp", "dim": 0}, {"tensor": {"tensor"}})
    method("all_reduce", {"tensor": x, "dims": "tp", "op": sum_op, "async_op": False}, {"tensor": {"tensor"}})
    method("average_gradients", {"module_or_params": [param], "dims": "dp", "bucket_mb": 25},
           {"module_or_params": {"tensor"}})  # fmt: skip
    method("barrier", {"dims": "tp", "async_op": False})
    method("broadcast", {"tensor": x, "dims": "tp", "group_src": 0, "async_op": False}, {"tensor": {"tensor"}})
    method("check_local_rank", {"ranks_per_node": 1})
    method("coord_of", {"rank": 0})
    method("create_pg", {"dims": "tp", "view": None, "strategy": None, "tag": None, "group_desc": "x"},
           {"group_desc": STRINGS})  # fmt: skip
    # dims_list is checked in hypergrid/grid/batch.py (the lead's): its message quotes the value with repr.
    method("create_pgs", {"dims_list": ["tp"], "view": None, "strategy": None, "tag": None},
           pending={"dims_list": "lead"})  # fmt: skip
    none4 = {"send_next": None, "send_prev": None, "recv_next": None, "recv_prev": None}
    tensors = {name: {"tensor"} for name in none4}
    method("exchange", {"dim": "tp", **none4}, tensors)
    method("get_pg", {"dims": "tp", "view": None, "tag": None, "within": None, "across": None})
    method("get_rank_enum", {"dims": "tp", "view": None})
    for call in ("group_rank", "group_ranks", "src_rank"):
        method(call, {"dims": "tp", "rank": 0})
    method("group_size", {"dims": "tp"})
    method("hierarchical_all_reduce", {"tensor": x, "dims": "tp", "op": sum_op, "ranks_per_node": 1},
           {"tensor": {"tensor"}})  # fmt: skip
    for call in ("is_first", "is_last", "next_rank", "prev_rank"):
        method(call, {"dim": "tp", "rank": 0})
    method("node_group", {"ranks_per_node": 1, "check_local_rank": False})
    method("node_ranks", {"rank": 0, "ranks_per_node": 1})
    method("node_report", {"ranks_per_node": 1})
    method("own_chunk", {"tensor": x, "dims": "tp", "dim": 0}, {"tensor": {"tensor"}})
    method("p2p_ops", {"dim": "tp", **none4}, tensors)
    method("pg", {"dims": "tp", "view": None, "tag": None, "within": None, "across": None})
    method("placement_report", {"topology": None, "ranks_per_node": 1})
    method("rank_of", {"base": 0, "tp": 0}, positional=("base",))
    method("rank_repr", {"rank": 0, "omit": (), "inner_sep": "_", "outer_sep": "-"},
           {"inner_sep": STRINGS, "outer_sep": STRINGS})  # fmt: skip
    method("reduce_scatter", {"tensor": x, "dims": "tp", "op": sum_op, "dim": 0}, {"tensor": {"tensor"}})
    method("register_view", {"name": "v", "shape": [1, 1], "dim_names": ["a", "b"], "shared_dims": None})
    method("shift", {"dim": "tp", "disp": 1, "periodic": False, "rank": 0}, {"disp": INTS})
    method("shrink", {"dead": None, "dim": "dp", "policy": "drop", "timeout_s": None, "step": None, "snapshots": None})
    method("standby", {"timeout_s": 1.0, "snapshots": None})
    method("grow", {"snapshots": None, "step": None, "dim": "dp", "policy": "drop", "timeout_s": None})
    method("arrive", {"timeout_s": 1.0, "snapshots": None, "store": dist.HashStore(), "wake_ranks": True})
    # device_type is to_device_mesh's own (hypergrid/grid/mesh.py, another helper's): it reaches torch unchecked.
    method("to_device_mesh", {"dims": ["tp"], "device_type": "cpu"}, pending={"device_type": "mesh"})
    method("view", {"shape": [1, 1], "dim_names": ["a", "b"], "shared_dims": None, "name": None})

    def function(name: str, call: Callable[[], Callable[..., Any]], kwargs: dict[str, Any], **extra: Any) -> None:
        table.append(Entry(name, name.rpartition(".")[2], call, kwargs, **extra))

    for call, kwargs in {
        "canonical_dims": {"dims": "tp"},
        "coord_of": {"rank": 0},
        "coords_array": {"ranks": [0]},
        "coords_of": {"rank": 0},
        "dim_indices": {"dims": "tp"},
        "dim_size": {"dim": "tp"},
        "group_index": {"dims": "tp", "rank": 0},
        "group_ranks": {"dims": "tp", "rank": 0},
        "group_size": {"dims": "tp"},
        "key": {"dims": "tp"},
        "node_report": {"ranks_per_node": 2},
        "num_groups": {"dims": "tp"},
        "rank_at": {"tp": 0, "dp": 0},
        "rank_enum": {"dims": "tp"},
        "rank_enum_array": {"dims": "tp"},
        "rank_of": {"coords": [0, 0]},
        "rank_repr": {"rank": 0, "omit": (), "inner_sep": "_", "outer_sep": "-"},
        "ranks_array": {"coords": [[0, 0]]},
        "replace": {"rank": 0, "tp": 1},
        "shift": {"dim": "tp", "rank": 0, "disp": 1, "periodic": False},
    }.items():
        skip = {"inner_sep": STRINGS, "outer_sep": STRINGS, "disp": INTS}
        table.append(Entry(f"GridLayout.{call}", call, lambda call=call: getattr(layout, call), kwargs, skip))

    grid_kwargs = {
        "shape": [1, 1],
        "dim_names": ["tp", "dp"],
        "rank_offset": 0,
        "backend": None,
        "strategy": "enumerate",
        "guard": True,
        "guard_timeout_s": 10.0,
        "guard_progress_s": 10.0,
        "share_groups": True,
        "group_options": None,
        "spares": 0,
        "check_collectives": False,
    }
    function("HyperCommGrid", lambda: HyperCommGrid, grid_kwargs)
    function("StepSnapshots", lambda: hypergrid.StepSnapshots, {"keep": 2})
    loop_kwargs = {"shape": [2, -1], "dim_names": ["tp", "dp"], "steps": 3, "spares": 0, "replicas": None,
                   "families": None, "policy": None, "keep": 2, "grid_options": None, "regrow": None,
                   "on_change": None, "verbose": False}  # fmt: skip
    function("ElasticLoop", lambda: hypergrid.ElasticLoop, loop_kwargs, skip={"on_change": {"lambda"}})
    function("GridLayout", lambda: GridLayout, {"shape": [2, 2], "dim_names": ["tp", "dp"], "rank_offset": 0})
    function("resolve_shape", lambda: hypergrid.layout.resolve_shape, {"shape": [1, -1], "world": 4, "rank_offset": 0})
    for call in ("copy_to", "reduce_from"):
        function(f"autograd.{call}", lambda call=call: getattr(hypergrid.autograd, call),
                 {"x": x, "grid": grid, "dims": "tp"}, skip={"x": {"tensor"}})  # fmt: skip
    for call in ("scatter_to", "gather_from", "reduce_scatter_to", "gather_from_sequence"):
        function(f"autograd.{call}", lambda call=call: getattr(hypergrid.autograd, call),
                 {"x": x, "grid": grid, "dims": "tp", "dim": 0}, skip={"x": {"tensor"}})  # fmt: skip
    spawn_kwargs = {"fn": _module_function, "nprocs": 1, "args": (), "backend": "gloo", "timeout_s": 10.0,
                    "allow_deaths": False}  # fmt: skip
    function("spawn", lambda: hypergrid.spawn, spawn_kwargs,
             skip={"args": {"list of a huge int", "nested list"}})  # fn's arguments are fn's business  # fmt: skip
    function("init_from_env", lambda: hypergrid.init_from_env, {"backend": "gloo", "timeout_s": 10.0})
    function("job_store", lambda: hypergrid.launch.job_store, {"timeout_s": 10.0})
    paths = {"directory": STRINGS}  # any string may name a directory: a long one is refused by the OS, or made
    function("enable_stack_dumps", lambda: hypergrid.launch.enable_stack_dumps,
             {"directory": tmp, "rank": 0, "signum": None}, skip=paths)  # fmt: skip
    function("read_stack_dumps", lambda: hypergrid.launch.read_stack_dumps, {"directory": tmp, "ranks": None},
             skip={"ranks": {"set"}, **paths})  # fmt: skip
    topo = hypergrid.topology
    function("Tier", lambda: topo.Tier, {"name": "node", "size": 8, "bandwidth": 1e11, "latency": 1e-6},
             skip={"name": STRINGS})  # fmt: skip
    function("Topology", lambda: topo.Topology, {"tiers": [tier]})
    function("Traffic", lambda: topo.Traffic, {"dims": "tp", "op": "all_reduce", "bytes": 1e6, "calls": 1},
             skip={"calls": {"2**63"}})  # fmt: skip
    function("bus_factor", lambda: topo.bus_factor, {"op": "all_reduce", "n": 2})
    function("collective_seconds", lambda: topo.collective_seconds,
             {"op": "all_reduce", "nbytes": 1e6, "span": span, "topology": topology})  # fmt: skip
    function("family_spans", lambda: topo.family_spans,
             {"sizes": [2, 2], "dim_names": ["tp", "dp"], "dims": "tp", "unit_ranks": [8]})  # fmt: skip
    llm = {"sizes": {"tp": 2}, "hidden": 64, "layers": 2, "seq_len": 8, "micro_batch": 1, "params": 1e6,
           "dtype_bytes": 2, "microbatches": 1, "experts": 0, "topk": 2}  # fmt: skip
    function("llm_step_traffic", lambda: topo.llm_step_traffic, llm, skip={name: {"2**63"} for name in llm})
    function("plan", lambda: topo.plan, {"sizes": {"tp": 2}, "traffic": [traffic], "topology": topology,
                                         "split": False})  # fmt: skip
    function("check_timeout", lambda: hypergrid.values.check_timeout, {"value": 1.0, "name": "t"},
             skip={"name": STRINGS})  # fmt: skip
    function("format_ranks", lambda: hypergrid.values.format_ranks, {"ranks": [0, 1]}, skip={"ranks": {"set"}})
    table.append(Entry("HyperCommGrid.to_device_meshes", "to_device_meshes", lambda: grid.to_device_meshes,
                       {"dims_list": [["tp"]], "device_type": "cpu"}))  # fmt: skip
    bridge_kwargs = {"src": grid, "dst": grid, "batch_dim": 0, "seq_dim": None, "variable_shapes": False, "dp": "dp",
                     "cp": "cp", "pp": "pp", "device": None}  # fmt: skip
    function("Bridge", lambda: hypergrid.Bridge, bridge_kwargs)
    sends = {"send_forward": "tensor", "send_backward": "grad", "send_forward_recv_backward": "tensor",
             "send_backward_recv_forward": "grad"}  # fmt: skip
    for call, argument in sends.items():
        table.append(Entry(f"Bridge.{call}", call, lambda call=call: getattr(hypergrid.Bridge(grid, grid), call),
                           {argument: x}, {argument: {"tensor"}}))  # fmt: skip
    table += _compat_entries(grid)
    return table


class _ParallelDims:
    """torchtitan 0.3's ``ParallelDims`` as far as ``build_mesh`` reads and writes it (degrees 1: a one-rank world)."""

    def __init__(self) -> None:
        self.dp_replicate = self.dp_shard = self.cp = self.tp = self.pp = self.ep = self.world_size = 1
        self.spmd_backend = "spmd_types"
        self._world_mesh: Any = None
        self._single_axis_meshes: dict[str, Any] = {}
        self._multi_axis_meshes: dict[str, Any] = {}
        self._spmd_meshes: list[Any] = []

    def get_activated_mesh(self, axes: list[str]) -> Any:
        return None

    def _validate_meshes(self) -> None:
        pass


def _compat_entries(grid: Any) -> list[Entry]:
    """The drop-in adapters: valid baselines (in a one-rank world) and every argument but ``**`` settings."""
    from hypergrid import HyperCommGrid
    from hypergrid.compat import deepspeed, megatron, mpu, torchtitan

    def entry(name: str, call: Callable[[], Callable[..., Any]], kwargs: dict[str, Any], **extra: Any) -> Entry:
        return Entry(name, name.rpartition(".")[2], call, kwargs, owner="compat", **extra)

    pgs = megatron.process_groups(tp=1, pp=1)  # a collection of its own grid, for the calls that take one
    titan_grid = HyperCommGrid([1] * len(torchtitan.DENSE_DIMS), list(torchtitan.DENSE_DIMS))
    ones = {name: 1 for name in ("tp", "pp", "cp", "ep", "etp", "dp", "gtp_remat", "egtp_remat")}
    roles = dict.fromkeys(("model", "context", "expert", "expert_tensor", "expert_data", "sequence", "expert_grid"))
    return [
        entry("ProcessTopology", lambda: deepspeed.ProcessTopology, {"axes": ["pipe", "data"], "dims": [1, 1]}),
        entry("PipeDataParallelTopology", lambda: deepspeed.PipeDataParallelTopology, {"num_pp": 1, "num_dp": 1}),
        entry(
            "PipeModelDataParallelTopology",
            lambda: deepspeed.PipeModelDataParallelTopology,
            {"num_pp": 1, "num_mp": 1, "num_dp": 1},
        ),
        entry(
            "RankGenerator",
            lambda: megatron.RankGenerator,
            {"tp": 1, "ep": 1, "dp": 1, "pp": 1, "cp": 1, "order": "tp-cp-ep-dp-pp", "rank_offset": 0, "gtp_remat": 1},
        ),
        entry(
            "grid_from_order",
            lambda: megatron.grid_from_order,
            {"order": "tp-dp", "sizes": {"dp": 1}, "rank_offset": 0, "backend": None, "tp": 1},
        ),
        entry(
            "moe_grids",
            lambda: megatron.moe_grids,
            {
                "tp": 1,
                "pp": 1,
                "etp": 1,
                "ep": 1,
                "cp": 1,
                "order": "tp-cp-ep-dp-pp",
                "rank_offset": 0,
                "backend": None,
                "gtp_remat": 1,
                "egtp_remat": 1,
            },
        ),
        entry("process_group_families", lambda: megatron.process_group_families, {"grid": grid, "expert": None}),
        entry(
            "MPU",
            lambda: mpu.MPU,
            {"grid": grid, "data": "dp", "tensor": "tp", "pipe": [], "create": False, **roles},
        ),
        entry(
            "process_groups",
            lambda: megatron.process_groups,
            {
                "grid": grid,
                "expert": None,
                "embedding": False,
                "distributed_optimizer_instances": 1,
                "hierarchical_cp": None,
                "all_gather": False,
            },
        ),
        Entry(
            "process_groups(sizes)",
            "process_groups",
            lambda: megatron.process_groups,
            {**ones, "order": "tp-cp-ep-dp-pp", "rank_offset": 0, "backend": None},
            owner="compat",
        ),
        entry("grid_of", lambda: megatron.grid_of, {"pgs": pgs}),
        entry("destroy_process_groups", lambda: megatron.destroy_process_groups, {"pgs": pgs}),
        entry("megatron_tokens", lambda: megatron.megatron_tokens, {"order": "tp-dp", "after": "tp"}),
        # torch takes any int64 seed, negative ones too (Megatron adds small offsets to it): -7 is a seed.
        # Without megatron-core the valid call raises DependencyError, after the arguments are checked.
        entry(
            "setup_model_state",
            lambda: megatron.setup_model_state,
            {"pgs": pgs, "seed": 0},
            skip={"seed": {"negative"}},
        ),
        # Without DeepSpeed the valid call raises DependencyError, after cls is checked to be None or a class.
        entry("pipeline_module", lambda: deepspeed.pipeline_module, {"cls": None}),
        entry(
            "build_mesh",
            lambda: torchtitan.build_mesh,
            {"parallel_dims": _ParallelDims(), "grid": None, "device_type": "cpu"},
        ),
        entry(
            "TitanMeshes",
            lambda: torchtitan.TitanMeshes,
            {
                "dp_replicate": 1,
                "dp_shard": 1,
                "cp": 1,
                "tp": 1,
                "pp": 1,
                "ep": 1,
                "world_size": 1,
                "spmd_backend": "spmd_types",
                "grid": titan_grid,
                "device_type": "cpu",
            },
        ),
    ]


@dataclass(frozen=True)
class Case:
    entry: Entry
    parameter: str
    label: str

    @property
    def owner(self) -> str:
        return self.entry.pending.get(self.parameter, self.entry.owner)


def _valid_by_annotation(entry: Entry, parameter: str) -> set[str]:
    """Hostile labels a parameter's annotation allows: ``True`` where a bool is taken."""
    try:
        annotation = str(inspect.signature(entry.target()).parameters[parameter].annotation)
    except (KeyError, TypeError, ValueError):
        return set()
    valid = {"bool"} if "bool" in annotation else set()
    if "float" in annotation:  # 2**63 is a finite number: a size, a bandwidth, a count of bytes
        valid.add("2**63")
    return valid


def cases(table: list[Entry]) -> list[Case]:
    """Every (entry, parameter, hostile label) the table calls for."""
    return [
        Case(entry, parameter, label)
        for entry in table
        for parameter in entry.kwargs
        for label in HOSTILE
        if label not in entry.skip.get(parameter, set()) | _valid_by_annotation(entry, parameter)
    ]


def names_the_call(message: str, call: str) -> bool:
    """Whether ``message`` is one line that names ``call`` (as a word)."""
    named = re.search(rf"(?<![A-Za-z0-9_]){re.escape(call)}(?![A-Za-z0-9_])", message)
    return "\n" not in message and named is not None


def outcome(entry: Entry, parameter: str, value: Any) -> tuple[str, str]:
    """What one hostile call did: ``clean``, ``accepted``, ``raw``, ``unnamed`` or ``torch``, and the detail."""
    from hypergrid import HyperGridError

    with no_torch_calls() as called:
        try:
            entry.invoke(parameter, value)
        except TorchCalled:
            return "torch", called[0]
        except HyperGridError as error:
            if called:
                return "torch", called[0]
            text = str(error)
            if not names_the_call(text, entry.call):
                return "unnamed", f"{type(error).__name__}: {text[:300]}"
            return "clean", ""
        except BaseException as error:  # the point: anything else escaped
            if isinstance(error, KeyboardInterrupt):
                raise
            return "raw", f"{type(error).__name__}: {_short(error)}"
    return ("torch", called[0]) if called else ("accepted", "")


def _short(error: BaseException) -> str:
    try:
        return str(error)[:200]
    except Exception:  # an error whose message cannot be printed
        return "<unprintable>"


def main(argv: list[str]) -> int:
    """Count the outcomes over the whole table; ``--failures`` lists each that is not clean."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    counts: dict[str, dict[str, int]] = {}
    failures = []
    for case in cases(entries()):
        kind, detail = outcome(case.entry, case.parameter, HOSTILE[case.label])
        counts.setdefault(case.owner, {}).setdefault(kind, 0)
        counts[case.owner][kind] += 1
        if kind != "clean":
            failures.append(f"{kind:8} {case.entry.name}({case.parameter}={case.label}): {detail}")
    for owner, kinds in counts.items():
        total = sum(kinds.values())
        print(f"{owner}: {total} hostile calls: " + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())))
    if "--failures" in argv:
        print("\n".join(failures))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
