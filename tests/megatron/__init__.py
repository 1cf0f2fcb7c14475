"""The Megatron tier (``make test-megatron``): hypergrid against Megatron-Core 0.19.2's own code, unmodified.

Needs megatron-core, which ships for CPython 3.12 only; ``.ci/megatron-env``
builds that environment. Under ``make test`` (Python 3.11, no megatron-core)
these modules skip, saying why.
"""
