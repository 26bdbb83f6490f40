"""A small MLP split into pipeline stages whose meshes use different layouts.

Two kinds of stage:

* :class:`DataParallelMLP`: a few dense layers (ReLU between, and after unless it is
  the model's last layer); the batch is split over the stage's mesh (``"S0R"``),
  weights are replicated and their gradients are partial sums over the mesh.
* :class:`ColumnParallelDense`: one dense layer whose weight columns are split over
  the mesh (Megatron's column-parallel layer): input replicated (``"RR"``), output
  split by features (``"RS0"``), input gradient a partial sum (``"RR+P0"``).

Between them the pipeline reshards activations across meshes (e.g. a 2-device
feature split to a 4-device batch split) and gradients back (reducing partial sums).
:func:`make_stages` builds the stage specs and :func:`reference` computes the same
loss and gradients in one process with numpy.

Run ``python -m reshard.pipeline.examples.mlp`` to train it for a few steps on local
worker processes and compare with the reference.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from reshard.core.cliargs import add_version
from reshard.core.errors import ReshardError
from reshard.core.mesh import DeviceMesh
from reshard.pipeline.stage import ParamSpec, StageSpec

MODULE = "reshard.pipeline.examples.mlp"
"""Where worker processes import the stage classes from (not ``__name__``: run as
``python -m reshard.pipeline.examples.mlp`` this module is ``__main__``, which a worker
process cannot import)."""


def _dense_backward(x: np.ndarray, w: np.ndarray, dz: np.ndarray) -> tuple[np.ndarray, np.ndarray,
                                                                        np.ndarray]:
    return dz @ w.T, x.T @ dz, dz.sum(axis=0)


class DataParallelMLP:
    """Dense layers on a batch shard, weights replicated.

    Args:
        layers: number of dense layers.
        last_relu: apply ReLU after the last layer too.
        batch: global rows of one microbatch (to scale the loss).
        microbatches: microbatches per iteration (loss is the mean over all rows).
    """

    def __init__(self, layers: int, last_relu: bool, batch: int, microbatches: int) -> None:
        self.layers = layers
        self.last_relu = last_relu
        self.scale = 1.0 / (batch * microbatches)

    def forward(self, params: Mapping[str, np.ndarray], x: np.ndarray) -> tuple[np.ndarray, Any]:
        """ReLU(x W + b) per layer."""
        saved = []
        h = x
        for i in range(self.layers):
            z = h @ params[f"w{i}"] + params[f"b{i}"]
            relu = i < self.layers - 1 or self.last_relu
            saved.append((h, z, relu))
            h = np.maximum(z, 0) if relu else z
        return h, saved

    def backward_input(self, params: Mapping[str, np.ndarray], saved: Any,
                       dy: np.ndarray) -> tuple[np.ndarray, Any]:
        """Back through every layer; weight grads are kept for backward_weight."""
        grads = {}
        d = dy
        for i in reversed(range(self.layers)):
            h, z, relu = saved[i]
            dz = d * (z > 0) if relu else d
            d, grads[f"w{i}"], grads[f"b{i}"] = _dense_backward(h, params[f"w{i}"], dz)
        return d, grads

    def backward_weight(self, params: Mapping[str, np.ndarray], saved: Any) -> dict[str, np.ndarray]:
        """The weight gradients computed with the input gradient."""
        return saved

    def loss(self, y: np.ndarray, target: np.ndarray) -> tuple[float, np.ndarray]:
        """Mean squared error over the iteration's rows (this shard's part)."""
        diff = y - target
        return 0.5 * float((diff * diff).sum()) * self.scale, diff * self.scale


class ColumnParallelDense:
    """One dense layer with its weight's columns split over the stage mesh.

    Args:
        relu: apply ReLU to the output.
        batch: global rows of one microbatch.
        microbatches: microbatches per iteration.
    """

    def __init__(self, relu: bool, batch: int, microbatches: int) -> None:
        self.relu = relu
        self.scale = 1.0 / (batch * microbatches)

    def forward(self, params: Mapping[str, np.ndarray], x: np.ndarray) -> tuple[np.ndarray, Any]:
        """This device's output columns."""
        z = x @ params["w"] + params["b"]
        return (np.maximum(z, 0) if self.relu else z), (x, z)

    def backward_input(self, params: Mapping[str, np.ndarray], saved: Any,
                       dy: np.ndarray) -> tuple[np.ndarray, Any]:
        """This device's addend of the input gradient (a partial sum over the mesh)."""
        x, z = saved
        dz = dy * (z > 0) if self.relu else dy
        return dz @ params["w"].T, (x, dz)

    def backward_weight(self, params: Mapping[str, np.ndarray], saved: Any) -> dict[str, np.ndarray]:
        """Gradients of this device's weight columns."""
        x, dz = saved
        return {"w": x.T @ dz, "b": dz.sum(axis=0)}

    def loss(self, y: np.ndarray, target: np.ndarray) -> tuple[float, np.ndarray]:
        """Mean squared error, this device's columns."""
        diff = y - target
        return 0.5 * float((diff * diff).sum()) * self.scale, diff * self.scale


def make_stages(kinds: Sequence[str], widths: Sequence[int], meshes: Sequence[DeviceMesh],
                batch: int, microbatches: int, layers_per_dp_stage: int = 2) -> list[StageSpec]:
    """Stage specs for an MLP.

    Args:
        kinds: per stage ``"dp"`` (data-parallel, ``layers_per_dp_stage`` layers) or
            ``"col"`` (one column-parallel layer).
        widths: feature widths at the stage boundaries: ``len(kinds) + 1`` values (a dp
            stage's inner layers keep its output width).
        meshes: one 1-axis mesh per stage.
        batch: rows per microbatch.
        microbatches: microbatches per iteration.
    """
    stages = []
    last = len(kinds) - 1
    for s, kind in enumerate(kinds):
        din, dout = widths[s], widths[s + 1]
        if kind == "dp":
            params = []
            for i in range(layers_per_dp_stage):
                a = din if i == 0 else dout
                params += [ParamSpec(f"w{i}", (a, dout), "RR", "RR+P0"),
                           ParamSpec(f"b{i}", (dout,), "R", "R+P0")]
            stages.append(StageSpec(
                meshes[s], f"{MODULE}:DataParallelMLP", (batch, din), (batch, dout),
                "S0R", "S0R", "S0R", tuple(params),
                (("batch", batch), ("last_relu", s != last), ("layers", layers_per_dp_stage),
                 ("microbatches", microbatches))))
        elif kind == "col":
            stages.append(StageSpec(
                meshes[s], f"{MODULE}:ColumnParallelDense", (batch, din), (batch, dout),
                "RR", "RS0", "RR+P0",
                (ParamSpec("w", (din, dout), "RS0", "RS0"), ParamSpec("b", (dout,), "S0", "S0")),
                (("batch", batch), ("microbatches", microbatches), ("relu", s != last))))
        else:
            raise ValueError(f"unknown stage kind {kind!r}; use 'dp' or 'col'")
    return stages


def init_params(stages: Sequence[StageSpec], seed: int = 0) -> list[dict[str, np.ndarray]]:
    """Global parameter values, float64, deterministic."""
    rng = np.random.default_rng(seed)
    out = []
    for st in stages:
        out.append({p.name: rng.normal(0, 1 / np.sqrt(p.shape[0]), p.shape)
                    if len(p.shape) == 2 else rng.normal(0, 0.1, p.shape) for p in st.params})
    return out


def reference(stages: Sequence[StageSpec], params: Sequence[Mapping[str, np.ndarray]],
              inputs: Sequence[np.ndarray], targets: Sequence[np.ndarray]
              ) -> tuple[list[float], list[dict[str, np.ndarray]]]:
    """Per-microbatch losses and accumulated gradients, computed in one process on
    whole arrays with the same modules (a one-device run of every stage)."""
    modules = [st.build() for st in stages]
    grads: list[dict[str, np.ndarray]] = [
        {k: np.zeros_like(v) for k, v in p.items()} for p in params]
    losses = []
    for x, t in zip(inputs, targets):
        saved = []
        h = x
        for m, p in zip(modules, params):
            h, s = m.forward(p, h)
            saved.append(s)
        loss, d = modules[-1].loss(h, t)
        losses.append(loss)
        for i in reversed(range(len(modules))):
            d, s = modules[i].backward_input(params[i], saved[i], d)
            for k, g in modules[i].backward_weight(params[i], s).items():
                grads[i][k] += g
    return losses, grads


def _stage_meshes(kinds: Sequence[str], n_stages: int
                  ) -> tuple[list[list[int]], list[DeviceMesh]]:
    """Each stage's hosts (one host per stage) and mesh: 2 devices for ``"col"``
    stages, alternately 2 and 4 for ``"dp"`` ones."""
    hosts: list[list[int]] = []
    meshes: list[DeviceMesh] = []
    next_dev = 0
    for s in range(n_stages):
        g = 2 if kinds[s] == "col" or s % 2 == 0 else 4
        devs = list(range(next_dev, next_dev + g))
        hosts.append(devs)
        meshes.append(DeviceMesh((g,), devices=devs))
        next_dev += g
    return hosts, meshes


def _max_diff(got: Sequence[dict], want: Sequence[dict]) -> float:
    """The largest absolute difference between two per-stage dicts of arrays."""
    return max(float(np.max(np.abs(got[v][k] - want[v][k])))
               for v in range(len(want)) for k in want[v])


def train(backend: str = "local", launcher: str | None = None, schedule: str = "eager-1f1b",
          kinds: Sequence[str] = ("dp", "col", "dp"), steps: int = 3, microbatches: int = 4,
          batch: int = 8, lr: float = 0.1, seed: int = 0, chunks: int = 1,
          log: Any = print) -> list[dict]:
    """Train the MLP for ``steps`` iterations on real workers and check every
    iteration's losses, gradients and updated parameters against :func:`reference`.

    Stage ``s`` gets a mesh of ``2`` devices for ``"col"`` stages and alternately 2 and
    4 for ``"dp"`` stages (so layouts and mesh sizes differ across stages); with
    ``chunks > 1`` the virtual stages take turns on the physical stages, as the
    schedule places them (interleaved, or in a V: ``zb-v``, ``eager-zb-v`` and
    ``dualpipe-v`` take ``chunks=2``).

    Returns:
        Per step: losses, the largest absolute difference from the reference (losses,
        gradients, parameters) and the iteration's wall time.
    """
    import reshard
    from reshard.pipeline.generators import make_schedule
    from reshard.pipeline.runtime import PipelineRuntime

    n_stages = len(kinds) // chunks
    options = {"n_chunks": chunks} if schedule == "interleaved-1f1b" else {}
    sched = make_schedule(schedule, n_stages, microbatches, **options)
    if sched.num_chunks != chunks:
        raise ReshardError(f"schedule {schedule!r} runs {sched.num_chunks} chunks per "
                           f"stage; give chunks={sched.num_chunks}")
    hosts, meshes = _stage_meshes(kinds, n_stages)
    vmeshes = [meshes[sched.locate(v)[0]] for v in range(len(kinds))]
    rng = np.random.default_rng(seed)
    width = [6] + [int(w) for w in rng.integers(5, 13, size=len(kinds) - 1)] + [3]
    stages = make_stages(kinds, width, vmeshes, batch, microbatches)
    params = init_params(stages, seed)
    inputs = [rng.normal(size=(batch, width[0])) for _ in range(microbatches)]
    targets = [rng.normal(size=(batch, width[-1])) for _ in range(microbatches)]
    cluster = reshard.Cluster.from_hosts(hosts)
    out = []
    with reshard.Runtime(backend, cluster=cluster, launcher=launcher) as rt:
        pipe = PipelineRuntime(rt, stages, sched)
        pipe.set_params(params)
        for step in range(steps):
            ref_losses, ref_grads = reference(stages, params, inputs, targets)
            result = pipe.step(inputs, targets)
            grads = pipe.gradients()
            pipe.sgd(lr)
            params = [{k: p[k] - lr * ref_grads[v][k] for k in p} for v, p in enumerate(params)]
            diff = max(float(np.max(np.abs(np.subtract(result.losses, ref_losses)))),
                       _max_diff(grads, ref_grads), _max_diff(pipe.parameters(), params))
            out.append({"step": step, "loss": result.loss, "ref_loss": float(sum(ref_losses)),
                        "max_abs_diff": diff, "wall_s": result.wall})
            log(f"step {step}: loss {result.loss:.6f} (reference {sum(ref_losses):.6f}), "
                f"max |difference| of losses/grads/params {diff:.2e}, {result.wall * 1e3:.1f} ms")
    return out


KINDS = ("dp", "col")
"""Stage kinds of ``--stages``."""


def _stage_kinds(text: str) -> tuple[str, ...]:
    import argparse

    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    bad = [k for k in kinds if k not in KINDS]
    if not kinds or bad:
        raise argparse.ArgumentTypeError(
            f"stage kinds are {' or '.join(KINDS)} (dp: data-parallel layers, col: a "
            f"column-parallel layer), comma-separated; got {text!r}")
    return kinds


def _parser(interleaved: str) -> Any:
    """The example's command line."""
    import argparse

    from reshard.comm.backend import BackendKind, builtin_backends
    from reshard.comm.launchers.base import LauncherKind
    from reshard.core.cliargs import positive_int
    from reshard.pipeline.generators import SCHEDULES

    ap = argparse.ArgumentParser(
        prog="python -m reshard.pipeline.examples.mlp",
        description="Pipeline-parallel MLP on reshard workers, checked against a "
                    "one-process numpy reference",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter, allow_abbrev=False)
    add_version(ap)
    registry = builtin_backends()
    backends = tuple(k.value for k in BackendKind)
    ap.add_argument("--backend", default="gloo", choices=backends,
                    help="data plane of the workers: " + ", ".join(
                        f"{b} ({registry.entry(b).summary})" for b in backends))
    ap.add_argument("--launcher", default=None, choices=tuple(k.value for k in LauncherKind),
                    help="how workers start (None: the backend's default)")
    ap.add_argument("--schedule", default="eager-1f1b", choices=tuple(SCHEDULES),
                    help="pipeline schedule")
    ap.add_argument("--stages", type=_stage_kinds, default=None,
                    help="virtual stage kinds, comma-separated: dp (data-parallel layers) "
                         "or col (a column-parallel layer) (None: dp,col,dp; with --chunks "
                         "2: dp,col,dp,dp)")
    ap.add_argument("--chunks", type=int, default=None,
                    help=f"virtual stages per stage, >= 2, {interleaved} only (None: 2 "
                         f"for {interleaved}, else 1)")
    ap.add_argument("--steps", type=positive_int, default=3, help="training steps")
    ap.add_argument("--microbatches", type=positive_int, default=4,
                    help="microbatches per step")
    ap.add_argument("--tolerance", type=float, default=1e-9,
                    help="largest difference from the reference that passes")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m reshard.pipeline.examples.mlp``: train and compare; exit 1 on mismatch
    or a failed execution, 2 on a usage error or a backend this machine lacks."""
    import sys

    from reshard.comm.backends.requirements import backend_problem
    from reshard.core.errors import ExecutionError, ReshardBaseError

    interleaved = "interleaved-1f1b"
    ap = _parser(interleaved)
    args = ap.parse_args(argv)
    if args.chunks is None:
        args.chunks = 2 if args.schedule == interleaved else 1
    if args.schedule == interleaved and args.chunks < 2:
        ap.error(f"--schedule {interleaved} needs --chunks >= 2 (virtual stages per stage), "
                 f"got {args.chunks}; leave --chunks out for 2")
    if args.schedule != interleaved and args.chunks != 1:
        ap.error(f"--chunks {args.chunks}: only --schedule {interleaved} runs several "
                 f"virtual stages per stage, not {args.schedule}; drop --chunks")
    kinds = args.stages or (("dp", "col", "dp") if args.chunks == 1 else
                            ("dp", "col", "dp", "dp") if args.chunks == 2 else
                            ("dp", "col") * args.chunks)
    if len(kinds) % args.chunks:
        ap.error(f"--stages has {len(kinds)} stage kinds, which {args.chunks} chunks per "
                 f"stage cannot share evenly: give a multiple of {args.chunks} kinds, e.g. "
                 f"--stages {','.join((kinds * args.chunks)[:args.chunks * 2])}")
    problem = backend_problem(args.backend)
    if problem:
        print(f"{ap.prog}: error: {problem}", file=sys.stderr)
        return 2
    try:
        rows = train(args.backend, args.launcher, args.schedule, kinds, args.steps,
                     args.microbatches, chunks=args.chunks)
    except ReshardBaseError as e:
        print(f"{ap.prog}: error: {e}", file=sys.stderr)
        return 1 if isinstance(e, ExecutionError) else 2
    worst = max(r["max_abs_diff"] for r in rows)
    print(f"{'OK' if worst <= args.tolerance else 'MISMATCH'}: worst difference {worst:.2e} "
          f"(tolerance {args.tolerance:g})")
    return 0 if worst <= args.tolerance else 1


if __name__ == "__main__":
    raise SystemExit(main())
