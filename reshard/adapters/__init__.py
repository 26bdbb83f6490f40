"""Layouts from other ecosystems' own types.

Each adapter is its own module, imported by name so that only the ecosystem it
speaks is needed: ``reshard.adapters.dtensor`` (torch), ``reshard.adapters.jax``
(jax), ``reshard.adapters.alpa`` (nothing beyond reshard: Alpa's sharding spec read
from plain Python values). This package imports none of them.
"""
