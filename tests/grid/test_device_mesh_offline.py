"""DeviceMesh export in one process: what is refused, and how a grid's mesh pickles (the rest: test_device_mesh)."""

from __future__ import annotations

import pickle

import pytest
import torch.distributed as dist

from hypergrid import HyperCommGrid, InvalidArgumentError, NotInitializedError


def test_export_needs_a_world_but_checks_dims_first() -> None:
    grid = HyperCommGrid([2, 2], ["tp", "dp"])
    with pytest.raises(NotInitializedError, match="to_device_mesh"):
        grid.to_device_mesh(["dp", "tp"])
    from hypergrid import DimsError

    with pytest.raises(DimsError, match="unknown dim 'ep'"):
        grid.to_device_mesh(["ep"])


def test_refusals(one_rank_world: None) -> None:
    grid = HyperCommGrid([1, 1, 1], ["tp", "cp", "dp"])
    mesh = grid.to_device_mesh(["dp", "cp", "tp"])
    with pytest.raises(InvalidArgumentError, match="device_type"):
        grid.to_device_mesh(["dp"], device_type="")
    with pytest.raises(InvalidArgumentError, match="backend_override"):
        mesh["dp", "cp"]._flatten("dc", backend_override="gloo")
    with pytest.raises(ValueError, match="root mesh"):
        mesh["dp", "cp"]._flatten("world")
    flat = mesh["dp", "cp"]._flatten("dc")
    assert mesh["dp", "cp"]._flatten("dc") is flat  # the same layout again: the same flattened mesh
    with pytest.raises(ValueError, match="hold 4 ranks"):
        mesh._unflatten(0, (2, 2), ("a", "b"))
    with pytest.raises(InvalidArgumentError, match="backend_override"):
        mesh._unflatten("dp", (1, 1), ("a", "b"), backend_override={"a": "gloo"})
    grid.destroy()


def test_a_pickled_mesh_is_torchs_plain_device_mesh(one_rank_world: None) -> None:
    from torch.distributed.device_mesh import DeviceMesh

    grid = HyperCommGrid([1, 1], ["tp", "dp"])
    mesh = grid.to_device_mesh({"batch": ("dp", "tp")})
    loaded = pickle.loads(pickle.dumps(mesh))
    assert type(loaded) is DeviceMesh and type(loaded._get_root_mesh()) is DeviceMesh
    assert loaded.mesh_dim_names == ("batch",) and loaded == mesh
    assert loaded.get_group() is dist.group.WORLD  # groups resolve by name, as torch's own meshes do
    grid.destroy()
