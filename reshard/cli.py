"""``reshard``: plan a resharding from the command line and print it, or serve the
gRPC service.

Example::

    reshard plan --shape 1024,1024,512 --dtype int32 \\
        --src-mesh 2x4 --src-spec S0RR --dst-mesh 2x4@8 --dst-spec S01RR \\
        --hosts 4x4 --strategy broadcast [--json plan.json]
    reshard plan --shape 4096,4096 --dtype bfloat16 --cast float8_e4m3fn \\
        --scale block128 --src-mesh 8 --src-spec S0R --dst-mesh 4@8 --dst-spec RS0 \\
        --hosts 2x8
    reshard serve [--host 127.0.0.1] [--port 50051] [--backend local] [--cluster 4x4]

Meshes are ``SHAPE[@FIRST_DEVICE]`` (``2x4@8`` = devices 8..15 row-major). ``reshard
serve --help`` lists the service's flags (docs/service.md).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable, Sequence

import reshard
from reshard.core.dtypes import CAST_TARGETS, DTYPES, ScaleMode
from reshard.core.helptext import for_terminal
from reshard.core.presets import preset_names
from reshard.service import serve_cli


def _ints(text: str, sep: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(sep) if x)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected integers separated by {sep!r}, got {text!r}") from None


def parse_mesh(text: str) -> reshard.DeviceMesh:
    """``"2x4@8"`` -> a (2, 4) mesh of devices 8..15."""
    shape_text, _, first = text.partition("@")
    shape = _ints(shape_text, "x")
    start = int(first) if first else 0
    return reshard.DeviceMesh(shape, devices=range(start, start + math.prod(shape)))


class _WithDefaults(argparse.RawDescriptionHelpFormatter,
                    argparse.ArgumentDefaultsHelpFormatter):
    """The description as written, and every flag's default in its help (where it
    has one: not None, not a switch's False)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default in (None, False):
            return action.help
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    """Argument parser."""
    ap = argparse.ArgumentParser(prog="reshard", description=for_terminal(__doc__),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", action="version",
                    version=f"%(prog)s {reshard.__version__}")
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plan", help="plan one tensor and print the plan",
                       description="Plan one tensor's move and print the plan (and its "
                                   "model time and lower bound).",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", required=True, type=lambda s: _ints(s, ","),
                   help="global shape, comma-separated (e.g. 1024,1024)")
    p.add_argument("--dtype", default="float32",
                   help=f"element type; one of {', '.join(DTYPES)} (default float32)")
    p.add_argument("--cast", default=None,
                   help=f"deliver this dtype, converted at the source; one of "
                        f"{', '.join(CAST_TARGETS)}")
    p.add_argument("--scale", default=None, choices=[m.value for m in ScaleMode],
                   help="scales of a --cast to float8 (delivered with the values)")
    p.add_argument("--src-mesh", required=True, type=parse_mesh,
                   help="source mesh SHAPE[@FIRST_DEVICE], e.g. 2x4 or 2x4@8 (devices 8..15)")
    p.add_argument("--src-spec", required=True,
                   help="source sharding, one token per dim (S<axes> or R), then +P<axes> "
                        "for a partial sum, e.g. S0R, RS01, S0R+P1")
    p.add_argument("--dst-mesh", required=True, type=parse_mesh, help="destination mesh")
    p.add_argument("--dst-spec", required=True, help="destination sharding")
    p.add_argument("--hosts", default=None, type=lambda s: _ints(s, "x"),
                   help="HOSTSxDEVICES of a regular cluster (default: one host holding "
                        "every device)")
    p.add_argument("--preset", default="paper", choices=preset_names(),
                   help="link figures of the cluster's hosts")
    p.add_argument("--strategy", default="broadcast",
                   choices=[s.value for s in reshard.Strategy],
                   help="how the plan moves data")
    p.add_argument("--memory-budget-mb", type=float, default=None,
                   help="at most this much staging memory per device, MiB (steps in "
                        "buckets, big boxes in pieces)")
    p.add_argument("--json", default=None, help="write the plan's JSON here")
    p.add_argument("--summary", action="store_true",
                   help="print the plan's summary line only, not every task")
    s = sub.add_parser("serve", help="serve plans, estimates and execution over gRPC",
                       description=for_terminal(serve_cli.__doc__),
                       formatter_class=_WithDefaults)
    serve_cli.add_arguments(s)
    return ap


def _plan(args: argparse.Namespace) -> int:
    """``reshard plan``."""
    try:
        cluster = (reshard.Cluster.regular(*args.hosts, preset=args.preset)
                   if args.hosts else None)
        p = reshard.plan(args.shape, args.dtype, reshard.Layout(args.src_mesh, args.src_spec),
                         reshard.Layout(args.dst_mesh, args.dst_spec), cluster=cluster,
                         strategy=args.strategy, cast=args.cast, scale=args.scale,
                         memory_budget=None if args.memory_budget_mb is None else
                         int(args.memory_budget_mb * (1 << 20)))
    except reshard.ReshardError as e:
        text = str(e)
        if "Cluster.regular" in text:  # the API's advice, in the CLI's words
            text = text.split("; build the cluster", 1)[0] + (
                "; give --hosts HOSTSxDEVICES with enough devices (or none: one host "
                "holding every device)")
        print(f"reshard: error: {text}", file=sys.stderr)
        return 2
    print(p.summary() if args.summary else p)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            f.write(p.to_json(indent=1))
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "plan": _plan,
    "serve": serve_cli.run,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point (a reader that goes away, as ``| head`` does, ends it quietly)."""
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except BrokenPipeError:
        # stdout's reader left: point stdout at nothing so that the interpreter's own
        # flush at exit does not fail again
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
