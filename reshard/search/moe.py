"""Candidates of a mixture-of-experts transformer (GShard's layout: every other layer's
feed-forward block is ``experts`` experts, each token routed to ``top`` of them), from
the same analytical model as :mod:`reshard.search.transformer`.

A MoE layer of hidden size ``h`` holds ``4 h^2`` attention parameters and ``8 h^2`` per
expert, and does ``8 b s h^2 + 4 b s^2 h`` (attention) ``+ top * 16 b s h^2``
(experts) FLOPs forward per microbatch. On a submesh of ``n`` devices it runs as:

* ``dp``: every expert on every device, the microbatch split over all ``n``; the
  gradients of all its parameters all-reduced once per iteration;
* ``ep``: expert parallel: the experts split over the ``n`` devices (``experts / n``
  each; ``n`` must divide ``experts``), attention data parallel; per microbatch the
  tokens go to their experts and come back, forward and backward: four all-to-alls of
  the activation (priced by reshard as the ``(b s, h)`` activation moved from rows
  split over the devices to columns split over them, the bytes an all-to-all moves);
  only the attention's gradients are all-reduced.

Both take and give the activation split over all devices (``S01RR``). The layers
between are the GPT's (``dp`` and ``tp``).
"""

from __future__ import annotations

from dataclasses import dataclass

from reshard.cluster import Cluster
from reshard.layout import Layout
from reshard.planner.estimates import CostCache, estimate
from reshard.search.model import Candidate, Layer, Placement, Shape
from reshard.search.transformer import (
    BYTES_PER_PARAM,
    GPT,
    GRAD_BYTES,
    activation_bytes,
    layer_candidates,
    submesh_shapes,
)


@dataclass(frozen=True)
class MoE:
    """A MoE configuration.

    Attributes:
        dense: the model without experts (hidden, heads, sequence, batch; its layer
            count is the MoE model's).
        experts: experts per MoE layer.
        top: experts per token.
    """

    dense: GPT
    experts: int = 16
    top: int = 2

    @property
    def name(self) -> str:
        """``<dense name>-moe<experts>``."""
        return f"{self.dense.name}-moe{self.experts}"

    def flops(self) -> float:
        """One MoE layer's forward FLOPs per microbatch."""
        b, s, h = self.dense.microbatch, self.dense.seq, self.dense.hidden
        return 8.0 * b * s * h * h + 4.0 * b * s * s * h + self.top * 16.0 * b * s * h * h


def moe_candidates(model: MoE, cluster: Cluster, shape: Shape, peak_flops: float,
                   efficiency: float = 0.5, cache: CostCache | None = None
                   ) -> tuple[Candidate, ...]:
    """The ``dp`` and ``ep`` candidates of one MoE layer on a submesh of ``shape``
    (module docstring; activation memory as the GPT layer's)."""
    cache = CostCache() if cache is None else cache
    g = model.dense
    hosts, per = shape
    n = hosts * per
    p = Placement(shape, 0)
    mesh = p.mesh()
    b, s, h = g.microbatch, g.seq, g.hidden
    attention, expert = 4 * h * h, 8 * h * h
    compute = 4 * model.flops() / (n * peak_flops * efficiency)
    work, keep = activation_bytes(b * s * h)

    def allreduce(params: int) -> float:
        if n == 1:
            return 0.0
        return estimate((params,), "bfloat16", Layout(mesh, "R+P01"), Layout(mesh, "R"),
                        cluster, cache=cache)

    whole = attention + model.experts * expert
    out = [Candidate("dp", compute + allreduce(whole) / g.microbatches, "S01RR", "S01RR",
                     BYTES_PER_PARAM * whole + work // n, GRAD_BYTES * whole, keep // n)]
    if n > 1 and model.experts % n == 0:
        a2a = 4 * estimate((b * s, h), "bfloat16", Layout(mesh, "S01R"), Layout(mesh, "RS01"),
                           cluster, cache=cache)
        held = attention + model.experts // n * expert
        out.append(Candidate("ep", compute + a2a + allreduce(attention) / g.microbatches,
                             "S01RR", "S01RR", BYTES_PER_PARAM * held + work // n,
                             GRAD_BYTES * held, keep // n))
    return tuple(out)


def moe_layers(model: MoE, cluster: Cluster, peak_flops: float, efficiency: float = 0.5,
               cache: CostCache | None = None) -> list[Layer]:
    """The chain of ``model``'s layers: dense (GPT) and MoE in turn, the first dense."""
    cache = CostCache() if cache is None else cache
    shapes = submesh_shapes(cluster)
    dense = {sh: layer_candidates(model.dense, cluster, sh, peak_flops, efficiency,
                                  cache=cache) for sh in shapes}
    experts = {sh: moe_candidates(model, cluster, sh, peak_flops, efficiency, cache)
               for sh in shapes}
    act = (model.dense.microbatch, model.dense.seq, model.dense.hidden)
    return [Layer(f"{model.name}.{k}", act, "bfloat16", experts if k % 2 else dense)
            for k in range(model.dense.layers)]


__all__ = ["MoE", "moe_candidates", "moe_layers"]
