"""One set of flags for every benchmark entry point, as nccl-tests ("all tests support
the same set of arguments").

Every flag is defined here once: its spellings, type, check and help text. An entry
point makes its parser with :func:`parser` and adds the groups it has, with its own
defaults:

* :func:`add_iterations`: ``-n/--iters``, ``-w/--warmup``;
* :func:`add_sizes`: ``-b/--minbytes``, ``-e/--maxbytes``, ``-f/--stepfactor``;
* :func:`add_cases`: ``--suite``, ``--cases``, ``--strategies``;
* :func:`add_cluster`: ``--hosts``, ``--devices-per-host``, ``--cluster``, ``--nic-gbps``;
* :func:`add_runtime`: ``--backend``, ``--launcher``, ``--timeout``;
* :func:`add_check`: ``-c/--check``;
* :func:`add_output`: ``-J/--json``, ``--no-progress`` (and ``--plot`` where offered).

Every parser has ``--version`` and shows each flag's default in ``--help``.
:func:`given` tells which flags the command line set (so a flag that does not apply
is an error, never silently ignored), and :func:`sizes` turns ``-b/-e/-f`` into the
sweep after :func:`check_sizes` refused an empty one.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from reshard.cliargs import add_version, int_at_least, natural_int, positive_int
from reshard.comm.backend import BackendKind, builtin_backends
from reshard.comm.backends.requirements import backend_problem  # noqa: F401
from reshard.comm.launchers.base import LauncherKind
from reshard.dtypes import CAST_TARGETS, DTYPES, Cast, ScaleMode, parse_dtype
from reshard.errors import ReshardError
from reshard.helptext import for_terminal
from reshard.planner.values.strategy import Strategy
from reshard.presets import preset_names

UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
STRATEGIES = tuple(s.value for s in Strategy)
BACKENDS = tuple(b.value for b in BackendKind)
LAUNCHERS = tuple(k.value for k in LauncherKind)
CPU_PLANES = tuple(e.name for e in builtin_backends().entries
                   if e.capabilities.device == "cpu" and "process" in e.launchers)
"""Backends whose ranks are processes on host memory: the CPU data planes a testbed
benchmark can run side by side."""
PROCESS_PLANES = tuple(e.name for e in builtin_backends().entries if "process" in e.launchers)
"""Backends whose ranks are processes (on host memory or a GPU)."""

FLAGS: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "iters": ("-n", "--iters"), "warmup": ("-w", "--warmup"),
    "minbytes": ("-b", "--minbytes"), "maxbytes": ("-e", "--maxbytes"),
    "stepfactor": ("-f", "--stepfactor"), "suite": ("--suite",), "cases": ("--cases",),
    "strategies": ("--strategies",), "hosts": ("--hosts",),
    "devices_per_host": ("--devices-per-host",), "cluster": ("--cluster",),
    "nic_gbps": ("--nic-gbps",), "backend": ("--backend",), "launcher": ("--launcher",),
    "timeout": ("--timeout",), "check": ("-c", "--check"), "json": ("-J", "--json"),
    "plot": ("--plot",), "no_progress": ("--no-progress",), "dtype": ("-d", "--dtype"),
    "cast": ("--cast",), "scale": ("--scale",),
})
"""Each shared flag's spellings, by destination."""


# ----- types: each parses one value or says what a valid one looks like ----------------------
def parse_size(text: str) -> int:
    """``"64M"`` -> 67108864: bytes with an optional K, M, G or T suffix (powers of
    1024, as nccl-tests), ``B`` / ``iB`` allowed after it; at least 1 byte."""
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    unit = t[-1] if t and t[-1] in UNITS else ""
    try:
        value = float(t[: len(t) - len(unit)]) * UNITS[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"bad size {text!r}: use bytes with an optional K/M/G/T suffix, e.g. 1024, "
            f"64K, 32M, 1G") from None
    if not value >= 1:
        raise argparse.ArgumentTypeError(f"a size must be at least 1 byte, got {text!r}")
    return int(value)


def human_bytes(n: int) -> str:
    """``1048576`` -> ``"1 MiB"`` (3 significant digits, powers of 1024)."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:.3g} {unit}"
        value /= 1024
    return f"{value:.3g} TiB"


def step_factor(text: str) -> int:
    """``-f``: the sweep's size factor, an integer >= 2."""
    return int_at_least(text, 2)


def positive_float(text: str) -> float:
    """A finite number > 0."""
    return _float_from(text, 0.0, inclusive=False)


def natural_float(text: str) -> float:
    """A finite number >= 0."""
    return _float_from(text, 0.0, inclusive=True)


def _float_from(text: str, low: float, *, inclusive: bool) -> float:
    """A finite number above ``low`` (or equal to it, ``inclusive``)."""
    rule = f"a number {'>=' if inclusive else '>'} {low:g}"
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {rule}, got {text!r}") from None
    if not (low <= value if inclusive else low < value) or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected {rule}, got {text!r}")
    return value


def strategy_list(text: str) -> tuple[str, ...]:
    """``"broadcast,send_recv"`` -> its strategies' names, each parsed once
    (:meth:`Strategy.parse`), duplicates dropped, in the order given."""
    names = [n for n in (s.strip() for s in text.split(",")) if n]
    if not names:
        raise argparse.ArgumentTypeError(
            f"no strategy given; valid strategies: {', '.join(STRATEGIES)}")
    out: list[str] = []
    for n in names:
        try:
            value = Strategy.parse(n).value
        except ReshardError:
            raise argparse.ArgumentTypeError(
                f"unknown strategy {n!r}; valid strategies: {', '.join(STRATEGIES)}") from None
        if value not in out:
            out.append(value)
    return tuple(out)


def name_list(text: str) -> tuple[str, ...]:
    """Comma-separated names, blanks around each dropped."""
    return tuple(n for n in (s.strip() for s in text.split(",")) if n)


# ----- actions: record which flags the command line gave ------------------------------------
class Given(argparse.Action):
    """``store``, and remember that the command line gave this flag."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values)
        _mark(namespace, self.dest)


class GivenTrue(argparse.Action):
    """``store_true``, and remember that the command line gave this flag."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=False, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        setattr(namespace, self.dest, True)
        _mark(namespace, self.dest)


def _mark(namespace: argparse.Namespace, dest: str) -> None:
    vars(namespace).setdefault("given_flags", set()).add(dest)


def given(args: argparse.Namespace) -> frozenset[str]:
    """Destinations of the flags the command line set (defaults not included)."""
    return frozenset(vars(args).get("given_flags", ()))


def as_dict(args: argparse.Namespace) -> dict[str, Any]:
    """The parsed flags as JSON-ready values (for a report's ``args``)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in vars(args).items()
            if k != "given_flags"}


def spelling(dest: str) -> str:
    """How ``--help`` writes the flag stored in ``dest`` (``"-n/--iters"``; a tool's
    own flag: ``--`` and the destination with dashes)."""
    return "/".join(FLAGS.get(dest, ("--" + dest.replace("_", "-"),)))


def refuse(ap: argparse.ArgumentParser, args: argparse.Namespace, dests: Iterable[str],
           why: str) -> None:
    """A usage error (exit 2) if the command line gave any flag of ``dests``: the flags
    named, then ``why`` (the rule and the fix)."""
    bad = [d for d in dests if d in given(args)]
    if bad:
        ap.error(f"{', '.join(spelling(d) for d in bad)}: {why}")


def check_names(ap: argparse.ArgumentParser, args: argparse.Namespace, dest: str,
                valid: Iterable[str]) -> None:
    """A usage error (exit 2) for names of the :func:`name_list` flag stored in ``dest``
    that are not among ``valid``: the flag, the unknown names, then the valid ones."""
    names = tuple(valid)
    bad = [n for n in getattr(args, dest) if n not in names]
    if bad:
        ap.error(f"{spelling(dest)}: unknown {bad}; valid: {', '.join(names)}")


# ----- the parser and its groups ----------------------------------------------------------
class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the description's layout and appends each flag's default to its help (not
    for defaults that mean "not set", which the help text explains)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if ("%(default)" in text or default in (None, False, argparse.SUPPRESS)
                or not action.option_strings):
            return text
        shown = ",".join(default) if isinstance(default, tuple) else "%(default)s"
        return f"{text} (default: {shown})"


def parser(prog: str, description: str) -> argparse.ArgumentParser:
    """A parser with the shared help layout, no abbreviated flags, and ``--version``."""
    ap = argparse.ArgumentParser(prog=prog, description=for_terminal(description),
                                 formatter_class=HelpFormatter, allow_abbrev=False)
    add_version(ap)
    return ap


def add_iterations(ap: argparse.ArgumentParser, iters: int, warmup: int,
                   iters_help: str = "timed runs per case and strategy; the median is "
                                     "reported",
                   warmup_help: str = "untimed runs before them (the plan is loaded in "
                                      "the first)") -> argparse._ArgumentGroup:
    """``-n/--iters`` and ``-w/--warmup``."""
    g = ap.add_argument_group("iterations")
    g.add_argument(*FLAGS["iters"], type=positive_int, default=iters, action=Given,
                   metavar="N", help=iters_help)
    g.add_argument(*FLAGS["warmup"], type=natural_int, default=warmup, action=Given,
                   metavar="N", help=warmup_help)
    return g


def add_sizes(ap: argparse.ArgumentParser, minbytes: str | None = None,
              maxbytes: str | None = None, what: str = "each case's own full size") -> argparse._ArgumentGroup:
    """``-b``, ``-e`` and ``-f``: the sizes swept (``what`` when neither is given)."""
    g = ap.add_argument_group("sizes (bytes of all of a case's tensors together; suffixes "
                              "K, M, G, T are powers of 1024)")
    g.add_argument(*FLAGS["minbytes"], type=parse_size, default=minbytes, action=Given,
                   metavar="SIZE",
                   help=f"smallest size of the sweep; with neither -b nor -e: {what}")
    g.add_argument(*FLAGS["maxbytes"], type=parse_size, default=maxbytes, action=Given,
                   metavar="SIZE", help="largest size (default: -b)")
    g.add_argument(*FLAGS["stepfactor"], type=step_factor, default=2, action=Given,
                   metavar="F", help="size factor between steps of the sweep")
    return g


def check_sizes(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Usage errors for a sweep that measures nothing: ``-b`` above ``-e``; ``-f``
    without a sweep."""
    lo, hi = args.minbytes, args.maxbytes
    if lo is not None and hi is not None and lo > hi:
        ap.error(f"-b {human_bytes(lo)} is larger than -e {human_bytes(hi)}: the sweep goes "
                 f"up from -b to -e, so it would hold no size; swap them")
    if "stepfactor" in given(args) and (lo is None or hi is None or lo == hi):
        ap.error("-f/--stepfactor sets the factor of a sweep from -b to -e, and there is "
                 "none; give -b and a larger -e")


def sizes(args: argparse.Namespace) -> list[int | None]:
    """The sizes of ``-b/-e/-f``, smallest first; ``[None]`` (each case's own size) when
    neither ``-b`` nor ``-e`` is set."""
    lo, hi = args.minbytes, args.maxbytes
    if lo is None and hi is None:
        return [None]
    lo = lo if lo is not None else hi
    hi = hi if hi is not None else lo
    out: list[int | None] = []
    s = lo
    while s <= hi:
        out.append(s)
        s *= args.stepfactor
    return out


def add_cases(ap: argparse.ArgumentParser, suites: Sequence[str] = (),
              suite: str | None = None, cases: str | None = None) -> argparse._ArgumentGroup:
    """``--suite`` (when there are ``suites``), ``--cases`` and ``--strategies``."""
    g = ap.add_argument_group("cases")
    if suites:
        g.add_argument(*FLAGS["suite"], choices=tuple(suites), default=suite, action=Given,
                       help="the benchmark suite")
    g.add_argument(*FLAGS["cases"], type=name_list, default=cases, action=Given, metavar="A,B",
                   help="comma-separated case names of the suite to run (default: all)")
    g.add_argument(*FLAGS["strategies"], type=strategy_list, default=",".join(STRATEGIES),
                   action=Given, metavar="A,B",
                   help=f"comma-separated, from {', '.join(STRATEGIES)}")
    g.add_argument(*FLAGS["dtype"], type=dtype_name, default=None, action=Given,
                   metavar="DTYPE",
                   help=f"every tensor's element type instead of the case's own (as "
                        f"nccl-tests' -d): {', '.join(DTYPES)}")
    g.add_argument(*FLAGS["cast"], type=dtype_name, default=None, action=Given,
                   metavar="DTYPE",
                   help=f"deliver every tensor as this dtype, converted at the source: "
                        f"{', '.join(CAST_TARGETS)}")
    g.add_argument(*FLAGS["scale"], choices=[m.value for m in ScaleMode], default=None,
                   action=Given,
                   help="scales of a --cast to float8 (block128, block128-ue8m0: tensors of "
                        "rank >= 2; mx32: rank >= 1)")
    return g


def dtype_name(text: str) -> str:
    """A dtype's name (:mod:`reshard.dtypes`); the valid ones listed otherwise."""
    try:
        return parse_dtype(text).name
    except ReshardError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def pick_cases(ap: argparse.ArgumentParser, available: Sequence[Any], wanted: Sequence[str] |
               None, suite: str, args: argparse.Namespace | None = None) -> list[Any]:
    """The cases (objects with a ``name``) named by ``--cases``, in the suite's order;
    every case when ``wanted`` is None; a usage error listing the valid names for a
    name the suite does not have. With ``args``, each case in the ``--dtype`` and with
    the ``--cast`` / ``--scale`` they name (:meth:`Case.converted`)."""
    if wanted is None:
        picked = list(available)
    else:
        names = [c.name for c in available]
        if not wanted:  # "" or "," (blanks are dropped)
            ap.error(f"--cases: the selection is empty; name cases of suite {suite}: "
                     f"{', '.join(names)}")
        unknown = [n for n in wanted if n not in names]
        if unknown:
            ap.error(f"--cases: no case {', '.join(map(repr, unknown))} in suite {suite}; "
                     f"valid: {', '.join(names)}")
        picked = [c for c in available if c.name in wanted]
    if args is None or (args.dtype, args.cast, args.scale) == (None, None, None):
        return picked
    try:
        cast = Cast.parse(args.cast, args.scale)
    except ReshardError as e:
        ap.error(f"--cast/--scale: {e}")
    return [c.converted(args.dtype, cast) for c in picked]


def add_cluster(ap: argparse.ArgumentParser, hosts: int | None = None,
                devices_per_host: int | None = None, presets: bool = True,
                local: bool = False) -> argparse._ArgumentGroup:
    """``--hosts``, ``--devices-per-host`` and (with ``presets``) ``--cluster``,
    ``--nic-gbps``; ``local``: ``--cluster local`` too (this machine, measured:
    :mod:`reshard.microbench.calibrate`)."""
    g = ap.add_argument_group("cluster")
    g.add_argument(*FLAGS["hosts"], type=positive_int, default=hosts, action=Given,
                   metavar="N",
                   help="hosts of the cluster the meshes are placed on; fewer than a case's "
                        "two meshes need make them share hosts" + (
                            "" if hosts is not None else " (default: just enough for each "
                            "case, source and destination on separate hosts)"))
    g.add_argument(*FLAGS["devices_per_host"], type=positive_int, default=devices_per_host,
                   action=Given, metavar="G",
                   help="devices per host; the meshes' devices-per-host axis is capped at "
                        "it" + ("" if devices_per_host is not None else
                                " (default: the cluster preset's, or the widest mesh)"))
    if presets:
        names = (*preset_names(), *(("local",) if local else ()))
        g.add_argument(*FLAGS["cluster"], choices=names, default=None, action=Given,
                       metavar="PRESET",
                       help=f"link figures of the modelled hosts, one of {', '.join(names)} "
                            f"(default: each case's own preset)" + (
                                "; local: this machine's loopback links, measured first, so "
                                "that run mode's bound is of the machine it runs on"
                                if local else ""))
        g.add_argument(*FLAGS["nic_gbps"], type=positive_float, default=None, action=Given,
                       metavar="GBIT", help="override the preset's NIC bandwidth, Gbit/s")
    return g


def cpu_planes(text: str) -> tuple[str, ...]:
    """A comma-separated list of :data:`CPU_PLANES` (each once, in order)."""
    names = tuple(dict.fromkeys(n.lower() for n in name_list(text)))
    bad = [n for n in names if n not in CPU_PLANES]
    if not names or bad:
        raise argparse.ArgumentTypeError(
            f"expected CPU data planes from {list(CPU_PLANES)}, comma-separated; got {text!r}")
    return names


def add_runtime(ap: argparse.ArgumentParser, backend: str = "gloo", timeout: float = 120.0,
                backends: Sequence[str] = BACKENDS,
                launchers: Sequence[str] = LAUNCHERS,
                several: bool = False) -> argparse._ArgumentGroup:
    """``--backend``, ``--launcher`` (unless ``backends`` is empty: a tool with one
    fixed) and ``--timeout``; ``several``: ``--backend`` takes a comma-separated list
    of CPU data planes (:func:`cpu_planes`), a tuple."""
    g = ap.add_argument_group("workers")
    if several:
        g.add_argument(*FLAGS["backend"], type=cpu_planes, default=(backend,), action=Given,
                       metavar="NAME[,NAME]",
                       help=f"the CPU data plane(s), from {', '.join(CPU_PLANES)}; several "
                            f"as 'tcp,nixl' run side by side, alternated")
        g.add_argument(*FLAGS["launcher"], choices=tuple(launchers), default=None,
                       action=Given, help="how workers start (default: process)")
    elif backends:
        _add_backend(g, backend, backends, launchers)
    g.add_argument(*FLAGS["timeout"], type=positive_float, default=timeout, action=Given,
                   metavar="S", help="seconds any blocking operation may take")
    return g


def _add_backend(g: argparse._ArgumentGroup, backend: str, backends: Sequence[str],
                 launchers: Sequence[str]) -> None:
    registry = builtin_backends()
    what = [f"{b} ({registry.entry(b).summary})" if b in registry else b for b in backends]
    g.add_argument(*FLAGS["backend"], choices=tuple(backends), default=backend, action=Given,
                   help="data plane: " + ", ".join(what))
    g.add_argument(*FLAGS["launcher"], choices=tuple(launchers), default=None, action=Given,
                   help="how workers start (default: " + (
                       "thread for local, process otherwise)" if "local" in backends
                       else "process)"))


def add_check(ap: argparse.ArgumentParser, check: int = 1) -> argparse._ArgumentGroup:
    """``-c/--check``."""
    g = ap.add_argument_group("correctness")
    g.add_argument(*FLAGS["check"], type=int, choices=(0, 1), default=check, action=Given,
                    help="1: compare every destination element with the source value "
                         "(#wrong); 0: do not")
    return g


def add_output(ap: argparse.ArgumentParser, plot: bool = False) -> argparse._ArgumentGroup:
    """``-J/--json``, ``--no-progress`` and (with ``plot``) ``--plot``."""
    g = ap.add_argument_group("output")
    g.add_argument(*FLAGS["json"], default=None, action=Given, metavar="PATH",
                   help="also write the results as JSON")
    if plot:
        g.add_argument(*FLAGS["plot"], default=None, action=Given, metavar="PATH.png",
                       help="also plot bandwidth per case and strategy with the lower "
                            "bound (needs matplotlib: the 'plot' extra)")
    g.add_argument(*FLAGS["no_progress"], action=GivenTrue,
                   help="no progress bar (there is none anyway when stdout or stderr is "
                        "not a terminal)")
    return g


def check_output_paths(ap: argparse.ArgumentParser, paths: Iterable[str | None]) -> None:
    """A usage error now, not after the run, for an output file whose folder is missing."""
    for path in paths:
        if path:
            folder = os.path.dirname(os.path.abspath(path))
            if not os.path.isdir(folder):
                ap.error(f"cannot write {path}: folder {folder} does not exist; create it "
                         f"or pick another path")


