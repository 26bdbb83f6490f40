"""Candidates of a GPT-style transformer layer, from an analytical model (AutoDDL's way:
FLOPs over peak, each layout's own collectives priced by reshard's cluster model).

A layer of hidden size ``h``, ``a`` heads, sequence ``s`` and microbatch ``b`` does
``24 b s h^2 + 4 b s^2 h`` FLOPs forward and twice that backward, and holds ``12 h^2``
parameters (Megatron's count). On a submesh of ``n = hosts x g`` devices it runs as:

* ``dp``: data parallel over all ``n`` devices (the microbatch split over them:
  activation ``S01RR`` on the 2-d submesh); compute ``4 F / (n P)`` (forward, the
  forward again under full recomputation, backward at twice the forward); its weight
  gradients are all-reduced once per iteration (a ``R+P01`` -> ``R`` move of the
  ``12 h^2`` parameters, priced by reshard, spread over the ``B`` microbatches); every
  device holds the whole layer's weights, gradients and Adam state.
* ``tp``: Megatron's tensor parallelism over one host's ``g`` devices, data parallel
  over the hosts (activation ``S0RR``: the microbatch split over hosts, replicated
  within one); compute ``4 F / (n P)`` plus four all-reduces of the activation per
  microbatch over the host's devices (two forward, two backward; a ``S0RR+P1`` ->
  ``S0RR`` move each, priced by reshard), and the weight gradients all-reduced over
  the hosts once per iteration; each device holds ``1/g`` of the layer.

``P`` is the device's peak times ``efficiency``; memory per device: 16 bytes per
parameter it holds (bf16 weights and gradients, fp32 Adam moments and master copy) and
one microbatch's whole activations (``34 b s h``, Megatron's estimate) while it
recomputes them (``Candidate.memory``); with full activation recomputation (as Alpa's
and Megatron's large runs) it keeps the layer's input of each microbatch in flight
(``2 b s h`` bytes, ``Candidate.activations``: the schedule decides how many,
:mod:`reshard.search.memory`); both split as the activation is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from reshard.cluster import Cluster
from reshard.layout import Layout
from reshard.planner.estimates import CostCache, estimate
from reshard.search.model import Candidate, Layer, Placement, Shape

BYTES_PER_PARAM = 16
"""bf16 weights and gradients, fp32 Adam moments and master weights."""

GRAD_BYTES = 2
"""A parameter's bf16 gradient: what data-parallel replicas all-reduce
(:mod:`reshard.search.replicas`)."""


@dataclass(frozen=True)
class GPT:
    """A GPT configuration (Alpa's benchmark suite names them by size).

    Attributes:
        name: e.g. ``"gpt-1.3b"``.
        layers: transformer layers.
        hidden: hidden size.
        heads: attention heads.
        seq: sequence length.
        microbatch: sequences per microbatch.
        batch: sequences per iteration (``batch / microbatch`` microbatches).
    """

    name: str
    layers: int
    hidden: int
    heads: int
    seq: int = 1024
    microbatch: int = 8
    batch: int = 1024

    @property
    def microbatches(self) -> int:
        """B."""
        return max(1, self.batch // self.microbatch)

    def flops(self) -> float:
        """One layer's forward FLOPs per microbatch."""
        b, s, h = self.microbatch, self.seq, self.hidden
        return 24.0 * b * s * h * h + 4.0 * b * s * s * h

    @property
    def params(self) -> int:
        """One layer's parameters."""
        return 12 * self.hidden * self.hidden


def _collective(cache: CostCache, cluster: Cluster, p: Placement, shape: tuple[int, ...],
                src: str, dst: str) -> float:
    return estimate(shape, "bfloat16", Layout(p.mesh(), src), Layout(p.mesh(), dst),
                    cluster, cache=cache)


def layer_candidates(model: GPT, cluster: Cluster, shape: Shape, peak_flops: float,
                     efficiency: float = 0.5, in_flight: int | None = None,
                     cache: CostCache | None = None) -> tuple[Candidate, ...]:
    """The ``dp`` and ``tp`` candidates of one layer on a submesh of ``shape`` (module
    docstring); ``in_flight``: a fixed count of microbatches whose inputs a device keeps,
    folded into ``memory`` (``activations`` 0; default: ``activations`` set, the
    schedule's count applies)."""
    cache = CostCache() if cache is None else cache
    hosts, g = shape
    n = hosts * g
    p = Placement(shape, 0)
    b, s, h = model.microbatch, model.seq, model.hidden
    compute = 4 * model.flops() / (n * peak_flops * efficiency)
    work, keep = activation_bytes(b * s * h, in_flight)
    out = []
    grads = 0.0
    if n > 1:
        grads = _collective(cache, cluster, p, (model.params,), "R+P01", "R")
    out.append(Candidate("dp", compute + grads / model.microbatches, "S01RR", "S01RR",
                         BYTES_PER_PARAM * model.params + work // n,
                         GRAD_BYTES * model.params, keep // n))
    if g > 1:
        act = 4 * _collective(cache, cluster, p, (b, s, h), "S0RR+P1", "S0RR")
        grads = 0.0 if hosts == 1 else _collective(
            cache, cluster, p, (model.params // g,), "R+P0", "R")
        out.append(Candidate("tp", compute + act + grads / model.microbatches, "S0RR",
                             "S0RR", BYTES_PER_PARAM * model.params // g + work // hosts,
                             GRAD_BYTES * model.params // g, keep // hosts))
    return tuple(out)


def activation_bytes(elements: int, in_flight: int | None = None) -> tuple[int, int]:
    """(memory, activations) of a layer whose activation has ``elements`` elements
    (module docstring: ``34`` bf16 values' worth while recomputing, ``2`` bytes per
    microbatch in flight); with ``in_flight`` that many microbatches' inputs are
    folded into the memory and none left per microbatch."""
    if in_flight is None:
        return 34 * elements, 2 * elements
    return (34 + 2 * in_flight) * elements, 0


def submesh_shapes(cluster: Cluster, powers_of_two: bool = False) -> tuple[Shape, ...]:
    """Alpa's submeshes: ``(1, 2^k)`` inside a host, and ``(h, G)`` whole hosts (with
    ``powers_of_two``: ``h`` a power of two only, as large clusters are cut)."""
    g = len(cluster.hosts[0])
    inside = [(1, 1 << k) for k in range(g.bit_length()) if 1 << k <= g]
    whole = [(h, g) for h in range(2, cluster.num_hosts + 1)
             if not powers_of_two or h & (h - 1) == 0]
    return (*inside, *whole)


def gpt_layers(model: GPT, cluster: Cluster, peak_flops: float, efficiency: float = 0.5,
               cache: CostCache | None = None,
               shapes: Sequence[Shape] | None = None) -> list[Layer]:
    """The chain of ``model``'s layers with their candidates on every submesh shape of
    ``cluster`` (or on ``shapes``; the embedding and head left out: a compiler adds
    them as layers)."""
    cache = CostCache() if cache is None else cache
    cands = {shape: layer_candidates(model, cluster, shape, peak_flops, efficiency,
                                     cache=cache)
             for shape in (submesh_shapes(cluster) if shapes is None else shapes)}
    act = (model.microbatch, model.seq, model.hidden)
    return [Layer(f"{model.name}.{k}", act, "bfloat16", cands) for k in range(model.layers)]


ALPA_SUITE = (
    GPT("gpt-350m", 24, 1024, 16),
    GPT("gpt-1.3b", 24, 2048, 32),
    GPT("gpt-2.6b", 32, 2560, 32),
    GPT("gpt-6.7b", 32, 4096, 32),
    GPT("gpt-15b", 48, 5120, 40),
)
"""GPT configurations as Alpa's benchmark suite sizes them (sequence 1024)."""


__all__ = ["ALPA_SUITE", "BYTES_PER_PARAM", "GPT", "GRAD_BYTES", "activation_bytes", "gpt_layers",
           "layer_candidates", "submesh_shapes"]
