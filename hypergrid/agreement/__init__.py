"""The agreement layer: the store protocol that makes ranks agree before they create groups.

``request`` says what a creation asks for (torch-free); ``protocol`` is the
O(1)-per-rank round on a store (torch-free: any object with ``add``, ``set``,
``get``, ``wait``, ``delete_key``); ``guard`` runs a round on torch's default
store and turns a disagreement or a missing rank into an error on every rank.
"""
