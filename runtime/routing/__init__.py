"""Routing: which version of a model serves a request, and which endpoint of that version.

Version choice follows the model's route (weighted split, sticky by a hash that is stable
across processes); endpoint choice runs small, named filters, scorers and a picker chosen per
pool in the snapshot (``PoolSnap.policies``), over signals the caller supplies (breakers,
health, the router's own in-flight counts). No network I/O and no Django here.
"""
