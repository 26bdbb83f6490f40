"""Core types <-> ``reshard.v1`` messages: meshes, sharding specs, layouts, clusters and
tensor requests (plans: :mod:`reshard.service.plan_codec`).

Decoding is the service's edge: every value is checked here or by the core type's own
constructor, and a bad one raises the core type's :class:`reshard.ReshardError`
subclass naming the field. Sizes are bounded (:data:`MAX_DEVICES`) before anything is
built, so that a small message cannot make the server allocate without limit.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from types import MappingProxyType
from typing import Any

from reshard.cluster import Cluster
from reshard.dtypes import Cast, ScaleMode
from reshard.errors import ClusterError, MeshError, ReshardError, SpecError
from reshard.layout import Layout
from reshard.mesh import DeviceMesh
from reshard.planner.values.strategy import Strategy
from reshard.planner.values.tasks import Derive, TensorSpec
from reshard.presets import PAPER_PRESET, PRESETS, preset_names
from reshard.service.enums import EnumPair
from reshard.service.v1 import reshard_pb2 as pb
from reshard.spec import ShardingSpec, SplitRule

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Reshard"].full_name
"""``reshard.v1.Reshard``: the service's full name (also its name for health checks)."""

MAX_DEVICES = 1 << 16
"""Devices a mesh, or a cluster given by size, may have in a request."""

FIGURES = ("intra_bandwidth", "nic_bandwidth", "latency", "intra_latency",
           "copy_bandwidth", "nics_per_host", "relay_piece", "shared_bandwidth",
           "message_cost", "part_cost", "cast_bandwidth")
"""The link figures a cluster message can set (Cluster fields of the same names)."""

STRATEGY = EnumPair(Strategy, pb.Strategy, "STRATEGY_")
"""Strategies both ways (a request's UNSPECIFIED is broadcast: :func:`strategy_from_pb`)."""
SCALE_MODE = EnumPair(ScaleMode, pb.ScaleMode, "SCALE_MODE_", unspecified=ScaleMode.NONE)
DERIVE = EnumPair(Derive, pb.Derive, "DERIVE_", unspecified=Derive.NONE)


# ----- meshes ---------------------------------------------------------------------------
def mesh_to_pb(mesh: DeviceMesh) -> pb.Mesh:
    """A mesh message (every field set)."""
    return pb.Mesh(shape=mesh.shape, devices=mesh.devices, axis_names=mesh.axis_names)


def mesh_from_pb(m: pb.Mesh, what: str = "mesh") -> DeviceMesh:
    """The mesh of a message; empty ``devices`` / ``axis_names`` take the defaults."""
    size = math.prod(m.shape)
    if size > MAX_DEVICES:
        raise MeshError(f"{what} of shape {tuple(m.shape)} has {size} devices, over the "
                        f"service's limit of {MAX_DEVICES}; use a smaller mesh")
    try:
        return DeviceMesh(tuple(m.shape), tuple(m.devices) if m.devices else None,
                          tuple(m.axis_names) if m.axis_names else None)
    except MeshError as e:
        raise MeshError(f"{what}: {e}") from None


# ----- specs ----------------------------------------------------------------------------
SPLIT_RULE = EnumPair(SplitRule, pb.SplitRule, "SPLIT_RULE_", unspecified=SplitRule.FLAT)
"""Split rules both ways (UNSPECIFIED: flat, the text form's default)."""


def split_rules() -> tuple[pb.SplitRule, ...]:
    """The split rules this server plans (message values, UNSPECIFIED left out)."""
    return tuple(SPLIT_RULE.to_pb.values())


def spec_to_pb(spec: ShardingSpec) -> pb.ShardingSpec:
    """A spec message with both the structured and the text form."""
    return pb.ShardingSpec(dims=[pb.MeshAxes(axes=a) for a in spec.dims],
                           partial=spec.partial, split_rule=SPLIT_RULE.to_pb[spec.rule],
                           text=str(spec))


def spec_from_pb(m: pb.ShardingSpec, what: str = "spec") -> ShardingSpec:
    """The spec of a message: its text form, its structured form (with its split rule),
    or both when they agree."""
    rule = SPLIT_RULE.decode(m.split_rule, f"{what}: split rule", SpecError)
    dims = tuple(tuple(a.axes) for a in m.dims)
    try:
        if not m.text:
            return ShardingSpec(dims, tuple(m.partial), rule)
        spec = ShardingSpec.parse(m.text)
    except SpecError as e:
        raise SpecError(f"{what}: {e}") from None
    # a rule matters only where two or more axes split one dim (else it is stored flat)
    stated = rule if any(len(a) > 1 for a in spec.dims) else SplitRule.FLAT
    if m.split_rule != pb.SPLIT_RULE_UNSPECIFIED and stated is not spec.rule:
        raise SpecError(
            f"{what}: text {m.text!r} has the {spec.rule.value} split rule but split_rule is "
            f"{pb.SplitRule.Name(m.split_rule)}; leave split_rule unset or make them agree "
            f"(the text marks the nested rule with ':nested')")
    if (dims or m.partial) and (dims, tuple(sorted(m.partial))) != (spec.dims, spec.partial):
        raise SpecError(
            f"{what}: text {m.text!r} and the structured form (dims {list(dims)}, partial "
            f"{list(m.partial)}) disagree; send one of them, or both describing the same spec")
    return spec


def layout_to_pb(layout: Layout) -> pb.Layout:
    """A layout message."""
    return pb.Layout(mesh=mesh_to_pb(layout.mesh), spec=spec_to_pb(layout.spec))


def layout_from_pb(m: pb.Layout, what: str = "layout") -> Layout:
    """The layout of a message (mesh and spec required)."""
    if not m.HasField("mesh"):
        raise MeshError(f"{what} has no mesh; set {what}.mesh (shape, devices)")
    mesh = mesh_from_pb(m.mesh, f"{what}.mesh")
    spec = spec_from_pb(m.spec, f"{what}.spec")
    try:
        return Layout(mesh, spec)
    except SpecError as e:
        raise SpecError(f"{what}: {e}") from None


# ----- clusters -------------------------------------------------------------------------
def figures_from_pb(m: pb.LinkFigures) -> dict[str, Any]:
    """The figures a message sets, as Cluster keyword overrides."""
    return {name: getattr(m, name) for name in FIGURES if m.HasField(name)}


def cluster_to_pb(cluster: Cluster) -> pb.Cluster:
    """The ``hosts`` form with every figure and the name (:meth:`Cluster.to_dict`)."""
    d = cluster.to_dict()
    return pb.Cluster(hosts=pb.HostsCluster(
        hosts=[pb.Host(devices=h) for h in d["hosts"]], name=d["name"],
        figures=pb.LinkFigures(**{name: d[name] for name in FIGURES if name in d})))


def _check_size(num_hosts: int, devices_per_host: int, what: str) -> None:
    if num_hosts * devices_per_host > MAX_DEVICES:
        raise ClusterError(
            f"{what} of {num_hosts} hosts x {devices_per_host} devices is over the service's "
            f"limit of {MAX_DEVICES} devices; use a smaller cluster")


def _preset_figures(name: str, what: str) -> str:
    key = name or "paper"
    if key not in preset_names():
        raise ClusterError(f"{what}: unknown preset {name!r}; valid: {list(preset_names())}")
    return key


def _preset_cluster(m: pb.PresetCluster) -> Cluster:
    name = _preset_figures(m.name, "cluster.preset")
    per_host = (m.devices_per_host
                or PRESETS[PAPER_PRESET if name == "paper" else name].devices_per_host)
    _check_size(m.num_hosts, per_host, "cluster.preset")
    return Cluster.preset(name, m.num_hosts, m.devices_per_host or None)


def _regular_cluster(m: pb.RegularCluster) -> Cluster:
    _check_size(m.num_hosts, m.devices_per_host, "cluster.regular")
    return Cluster.regular(m.num_hosts, m.devices_per_host,
                           preset=_preset_figures(m.preset, "cluster.regular"),
                           **figures_from_pb(m.figures))


def _hosts_cluster(m: pb.HostsCluster) -> Cluster:
    devices = sum(len(h.devices) for h in m.hosts)
    if devices > MAX_DEVICES:
        raise ClusterError(f"its hosts list {devices} devices, over the service's limit of "
                           f"{MAX_DEVICES}; use a smaller cluster")
    overrides = figures_from_pb(m.figures)
    if m.HasField("name"):
        overrides["name"] = m.name
    return Cluster.from_hosts([tuple(h.devices) for h in m.hosts],
                              preset=_preset_figures(m.preset, "cluster.hosts"), **overrides)


CLUSTER_KINDS = MappingProxyType({
    "preset": lambda m: _preset_cluster(m.preset),
    "regular": lambda m: _regular_cluster(m.regular),
    "hosts": lambda m: _hosts_cluster(m.hosts),
})
"""How each form of the ``Cluster.kind`` oneof becomes a Cluster."""


def cluster_from_pb(m: pb.Cluster, default: Cluster | None = None) -> Cluster | None:
    """The cluster of a message; ``default`` when none of its forms is set."""
    kind = m.WhichOneof("kind")
    if kind is None:
        return default
    try:
        return CLUSTER_KINDS[kind](m)
    except ClusterError as e:
        raise ClusterError(f"cluster.{kind}: {e}") from None


# ----- requests -------------------------------------------------------------------------
Request = tuple[tuple[int, ...], str, Layout, Layout, Cast | None]
"""``(shape, dtype, src, dst, cast)``: what :func:`reshard.plan_many` takes."""


def tensor_to_pb(shape: Sequence[int], dtype: str, src: Layout, dst: Layout,
                 cast: Cast | None = None,
                 encode: Callable[[Layout], Any] = layout_to_pb) -> pb.Tensor:
    """A tensor message (``encode``: the message of a layout)."""
    msg = pb.Tensor(shape=shape, dtype=dtype, src=encode(src), dst=encode(dst))
    if cast is not None:
        _no_fold(cast.fold, str(cast))
        msg.cast = cast.dtype
        msg.scale = SCALE_MODE.to_pb[cast.scale]
    return msg


def _no_fold(fold: bool, what: str) -> None:
    """Refuse a folded cast (:class:`reshard.dtypes.Cast`'s ``fold``): the service's
    messages do not carry it."""
    if fold:
        raise ReshardError(f"{what}: the gRPC service carries no folded scale blocks "
                           f"(Cast(..., fold=True)); plan it in process (reshard.plan_many, "
                           f"Executor.load_request)")


def _layouts(m: pb.Tensor, what: str) -> tuple[Layout, Layout]:
    for side in ("src", "dst"):
        if not m.HasField(side):
            raise SpecError(f"{what} has no {side} layout; set {what}.{side}")
    return layout_from_pb(m.src, f"{what}.src"), layout_from_pb(m.dst, f"{what}.dst")


def tensor_from_pb(m: pb.Tensor, what: str = "tensor") -> Request:
    """``(shape, dtype, src, dst, cast)`` of a request's tensor message (checked by the
    planner); a request names no derived tensor."""
    src, dst = _layouts(m, what)
    if m.derive not in (pb.DERIVE_UNSPECIFIED, pb.DERIVE_NONE) or m.HasField("link"):
        raise ReshardError(f"{what} sets derive/link, which only a plan's tensors carry (the "
                           f"planner adds a scaled cast's amax and scales); drop them")
    scale = SCALE_MODE.decode(m.scale, f"{what}.scale")
    return tuple(m.shape), m.dtype, src, dst, Cast.parse(m.cast or None, scale)


def tensor_spec_to_pb(t: TensorSpec) -> pb.Tensor:
    """A plan tensor's message."""
    _no_fold(t.fold, str(t))
    msg = pb.Tensor(shape=t.shape, dtype=t.dtype, src=layout_to_pb(t.src),
                    dst=layout_to_pb(t.dst), cast=t.cast, scale=SCALE_MODE.to_pb[t.scale],
                    derive=DERIVE.to_pb[t.derive])
    if t.link >= 0:
        msg.link = t.link
    return msg


def tensor_spec_from_pb(m: pb.Tensor, what: str = "tensor") -> TensorSpec:
    """A plan tensor of its message (checked by the plan verifier)."""
    src, dst = _layouts(m, what)
    return TensorSpec(tuple(m.shape), m.dtype, src, dst, m.cast,
                      SCALE_MODE.decode(m.scale, f"{what}.scale"),
                      DERIVE.decode(m.derive, f"{what}.derive"),
                      m.link if m.HasField("link") else -1)


def strategy_from_pb(value: int) -> Strategy:
    """A request's strategy (UNSPECIFIED: broadcast)."""
    if value == pb.STRATEGY_UNSPECIFIED:
        return Strategy.BROADCAST
    return STRATEGY.decode(value, "strategy")


def request_to_pb(requests: Sequence[Request], cluster: Cluster | None,
                  strategy: Strategy | str, *,
                  encode: Callable[[Any], Any] | None = None) -> pb.PlanRequest:
    """A PlanRequest for :func:`reshard.plan_many`'s arguments (the cluster in the
    explicit ``hosts`` form; ``None``: unset, the server's default).

    Args:
        requests: ``(shape, dtype, src, dst, cast)`` each.
        cluster: the cluster, or None.
        strategy: the strategy.
        encode: the message of a Layout or Cluster (default :func:`layout_to_pb` /
            :func:`cluster_to_pb`; a client passes a cached one: callers reuse layouts).
    """
    encode = encode or encode_value
    msg = pb.PlanRequest(tensors=[tensor_to_pb(*r, encode=encode) for r in requests],
                         strategy=STRATEGY.to_pb[Strategy.parse(strategy)])
    if cluster is not None:
        msg.cluster.CopyFrom(encode(cluster))
    return msg


def encode_value(value: Layout | Cluster) -> pb.Layout | pb.Cluster:
    """The message of a Layout or a Cluster."""
    return layout_to_pb(value) if isinstance(value, Layout) else cluster_to_pb(value)


def request_from_pb(m: pb.PlanRequest, default_cluster: Cluster | None
                    ) -> tuple[list[Request], Cluster | None, Strategy]:
    """The arguments of :func:`reshard.plan_many` a PlanRequest stands for."""
    if not m.tensors:
        raise ReshardError("the request has no tensors; add at least one to "
                           "PlanRequest.tensors")
    reqs = [tensor_from_pb(t, f"tensors[{i}]") for i, t in enumerate(m.tensors)]
    return reqs, cluster_from_pb(m.cluster, default_cluster), strategy_from_pb(m.strategy)
