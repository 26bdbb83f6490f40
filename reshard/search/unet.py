"""A U-Transformer (the model in Alpa's paper where cross-mesh resharding mattered
most): a GPT's layers as an encoder half and a decoder half, each decoder layer also
taking the output of its mirror in the encoder (a skip connection), as a
:class:`reshard.search.Graph`.

With ``2k`` layers, layer ``k + i`` (decoder) takes layer ``k + i - 1``'s output and
layer ``k - 1 - i``'s (the skip; for ``i = 0`` it is the same edge). Every layer has
the GPT layer's candidates (:func:`reshard.search.transformer.layer_candidates`); the
skip's activation has the layer's shape. A skip from an early stage to a late one is a
cross-mesh move in each microbatch, there and (its gradient) back.
"""

from __future__ import annotations

from reshard.cluster import Cluster
from reshard.errors import SearchError
from reshard.planner.estimates import CostCache
from reshard.search.chain import chain_edges
from reshard.search.graph import Graph
from reshard.search.transformer import GPT, gpt_layers


def skips(layers: int) -> tuple[tuple[int, int], ...]:
    """The skip connections of a U of ``layers`` layers (module docstring)."""
    k = layers // 2
    return tuple((k - 1 - i, k + i) for i in range(1, k))


def u_transformer(model: GPT, cluster: Cluster, peak_flops: float, efficiency: float = 0.5,
                  cache: CostCache | None = None) -> Graph:
    """``model``'s layers as a U (module docstring), with their candidates on every
    submesh shape of ``cluster``."""
    if model.layers < 2 or model.layers % 2:
        raise SearchError(f"a U-Transformer has an even number >= 2 of layers; "
                          f"{model.name!r} has {model.layers}")
    layers = gpt_layers(model, cluster, peak_flops, efficiency, cache)
    return Graph(tuple(layers), chain_edges(len(layers)) + skips(len(layers)))


__all__ = ["skips", "u_transformer"]
