"""Adapters for the systems hypergrid users come from: DeepSpeed, Megatron-Core, MPU-style trainers.

Each keeps the API its users know, computed by hypergrid's layout (O(ndim) or
O(group) where the originals scan all ranks), with hypergrid's errors instead
of asserts and silent empty answers.
"""
