"""PyTorch DTensor adapter, one import path: layouts (a ``DeviceMesh`` and its
placements <-> a reshard :class:`~reshard.core.layout.Layout`,
:mod:`reshard.adapters.dtensor_layout`) and cross-mesh ``redistribute`` /
``redistribute_many`` (:mod:`reshard.adapters.dtensor_redistribute`, which builds on
the layouts)."""

from reshard.adapters.dtensor_layout import from_layout, mesh_of, to_layout, to_placements
from reshard.adapters.dtensor_redistribute import Redistributor, redistribute, redistribute_many

__all__ = ["Redistributor", "from_layout", "mesh_of", "redistribute", "redistribute_many",
           "to_layout", "to_placements"]
