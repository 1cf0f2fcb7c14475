"""The layer rule of tests/layering.py holds for the source, and docs/architecture.md draws it."""

from __future__ import annotations

import ast
import re
import subprocess
import sys

from tests import layering


def test_every_module_belongs_to_a_layer() -> None:
    for name in layering.modules():
        layering.layer_of(name)  # raises LookupError naming the module


def test_imports_point_downward() -> None:
    upward = []
    for module, targets in layering.internal_graph().items():
        for target in targets:
            source, dest = layering.layer_of(module), layering.layer_of(target)
            if layering.rank(dest) > layering.rank(source):
                upward.append(f"hypergrid.{module} ({source.name}) imports hypergrid.{target} ({dest.name})")
    assert not upward, "\n".join(upward)


def test_no_import_circles() -> None:
    assert layering.cycles(layering.internal_graph()) == []


def test_the_checks_find_a_circle_and_an_upward_import() -> None:
    assert layering.cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert layering.rank(layering.layer_of("grid.views")) > layering.rank(layering.layer_of("layout.spec"))
    assert layering.layer_of("grid") is layering.layer_of("grid.grid")
    assert layering.layer_of("") is layering.layer_of("autograd")  # the facade


def test_adapters_use_no_private_member_of_the_grid() -> None:
    assert {"_batch", "_pgs", "_core", "_views"} <= layering.private_grid_members()  # the check sees them
    uses = layering.adapter_private_uses()
    assert not uses, f"compat uses private grid members (use hypergrid.grid.core.GridCore): {uses}"


def test_facets_use_only_the_cores_declared_interface() -> None:
    """No facet uses another's private member, reaches past FacetCore's declared names, or keeps state of its own."""
    assert {"grid.batch", "grid.views", "ops.collectives", "grid.elastic"} <= set(layering.facet_modules())
    core = layering.declared(layering.CORE_MODULE, layering.CORE_CLASSES)
    assert {"registry", "family", "key", "epoch", "views", "groups"} <= core  # the check sees the core
    assert not {"stale_epoch", "view_keys", "call_ledger"} & core  # the front's and the ops' members, not a facet's
    coupling = layering.facet_coupling()
    assert not coupling, "\n".join(coupling)


def test_grid_ops_and_compat_use_the_world_their_grid_holds() -> None:
    """No global world lookup in grid/, ops/ or compat/ but the grid core's one (issue 44)."""
    planted = {
        "ops.x": "from hypergrid.agreement.world import current_world\nw = World.current()\nWORLDS.state()",
        "grid.core": "w = World.current()",
    }
    assert layering.world_lookups(planted) == [
        "hypergrid.ops.x:1 import current_world",
        "hypergrid.ops.x:2 World.current (only grid.core looks a world up)",
        "hypergrid.ops.x:3 WORLDS",
    ]
    found = layering.world_lookups()
    assert not found, "\n".join(found)


def test_no_slot_of_the_core_is_assigned_outside_its_class() -> None:
    """A walk of create_pg's dims or shrink's dead reaches torch: nothing binds the core's members at run time."""
    planted = {
        "grid.front": "core.create_families = creation.create_families\nsetattr(grid._core, 'x', 1)",
        "grid.core": "class GridCore:\n    def f(self, core):\n        core.ok = 1",
    }
    assert layering.core_slot_writes(planted) == [
        "hypergrid.grid.front:1 .create_families = ...",
        "hypergrid.grid.front:2 setattr(core, ...)",
    ]
    found = layering.core_slot_writes()
    assert not found, "\n".join(found)


def test_module_level_state_is_the_registry_of_worlds_or_named() -> None:
    """A new module-level dict, list, set or object (or a ``global``) fails until MODULE_STATE names its reason."""
    found = layering.module_state()
    unnamed = {name: kind for name, kind in found.items() if name not in layering.MODULE_STATE}
    assert not unnamed, f"module-level mutable state (hold it in the World object or a grid): {unnamed}"
    stale = sorted(set(layering.MODULE_STATE) - set(found))
    assert not stale, f"tests/layering.py MODULE_STATE names state that is gone: {stale}"


def test_the_state_check_sees_each_kind() -> None:
    source = "a = {}\nb: list[int] = []\nc = {1}\nd = Thing()\ne = frozenset()\ndef f():\n    global a\n"
    kinds = [layering._mutable_kind(node.value) for node in ast.parse(source).body[:5]]  # type: ignore[attr-defined]
    assert kinds == ["a dict", "a list", "a set", "an instance (Thing(...))", None]


def test_pure_layers_import_no_torch_anywhere() -> None:
    for name, path in layering.modules().items():
        if layering.layer_of(name).pure:
            roots = {target.split(".")[0] for target in layering.imports(path)}
            assert "torch" not in roots, f"hypergrid.{name} is in a pure layer but imports torch"


def test_pure_layers_and_the_planner_load_without_torch() -> None:
    code = (
        "import sys, hypergrid.layout, hypergrid.values, hypergrid.errors, hypergrid.cluster.placement, "
        "hypergrid.cluster.calibrate, hypergrid.topology, hypergrid.cli.plan; print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_architecture_page_is_generated_from_the_rule() -> None:
    page, fresh = layering.page_block(), layering.render()
    # The structure must match exactly; line counts may drift by 15% before the page must be regenerated.
    number = re.compile(r"\d+")
    assert number.sub("N", page) == number.sub("N", fresh), "run `python -m tests.layering` to regenerate"
    for old, new in zip(number.findall(page), number.findall(fresh)):
        assert abs(int(old) - int(new)) <= max(3, 0.15 * int(new)), (old, new)


def test_modules_stay_small() -> None:
    big = {name: n for name, path in layering.modules().items() if (n := len(path.read_text().splitlines())) > 400}
    assert not big, f"split these modules (at most ~400 lines each): {big}"
