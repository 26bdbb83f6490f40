"""Regenerate (or check) the checked-in Python stubs of ``reshard/service/v1/reshard.proto``.

Run from anywhere::

    python -m reshard.service.regen           # rewrite reshard_pb2.py, .pyi, _grpc.py
    python -m reshard.service.regen --check   # exit 1 if the checked-in stubs differ

The stubs are made by ``grpcio-tools`` (its bundled ``protoc``); the version guard in the
generated files then requires a protobuf runtime at least as new as that ``protoc``'s
Python gencode version and a grpcio at least as new as grpcio-tools (see
docs/service.md, "Versions"). Use the pinned grpcio-tools (constraints.txt) so that the
check compares like with like.
"""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
import subprocess
import sys
import tempfile
from collections.abc import Sequence

from reshard.cliargs import add_version
from reshard.helptext import for_terminal

PROTO = pathlib.PurePosixPath("reshard/service/v1/reshard.proto")
"""The .proto, relative to the import root (the folder holding ``reshard/``)."""

STUBS = ("reshard_pb2.py", "reshard_pb2.pyi", "reshard_pb2_grpc.py")
"""Files generated next to the .proto."""


def import_root() -> pathlib.Path:
    """The folder holding the ``reshard`` package (protoc's ``-I``)."""
    return pathlib.Path(__file__).resolve().parents[2]


def stub_dir() -> pathlib.Path:
    """Where the checked-in stubs live."""
    return import_root() / PROTO.parent


def run_protoc(args: list[str]) -> int:
    """grpcio-tools' protoc on ``args`` (its well-known types included), in a process of
    its own: protoc's C++ runtime and other native libraries that bundle their own
    (NIXL's: the nixl backend) abort when loaded into one process, so protoc is never
    imported into the caller's. Returns its exit status.

    Raises:
        RuntimeError: grpcio-tools is missing.
    """
    spec = importlib.util.find_spec("grpc_tools")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "regenerating the service stubs needs grpcio-tools; install it with "
            "`pip install -c constraints.txt grpcio-tools`")
    include = pathlib.Path(next(iter(spec.submodule_search_locations))) / "_proto"
    return subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{include}", *args],
                          check=False).returncode


def generate(out_root: pathlib.Path) -> dict[str, str]:
    """Run protoc on the .proto into ``out_root``; returns ``{stub name: text}``.

    Raises:
        RuntimeError: grpcio-tools is missing or protoc failed (its exit status).
    """
    root = import_root()
    status = run_protoc([f"-I{root}", f"--python_out={out_root}", f"--pyi_out={out_root}",
                         f"--grpc_python_out={out_root}", str(root / PROTO)])
    if status != 0:
        raise RuntimeError(f"protoc exited with status {status} on {root / PROTO}")
    folder = out_root / PROTO.parent
    return {name: (folder / name).read_text(encoding="utf-8") for name in STUBS}


def _stale_stubs(write: bool) -> list[str]:
    """Stub files whose checked-in text differs from what protoc makes now, each
    overwritten with the fresh text when ``write``."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(pathlib.Path(tmp))
    stale = []
    for name, text in fresh.items():
        path = stub_dir() / name
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            if write:
                path.write_text(text, encoding="utf-8")
            stale.append(name)
    return stale


def differences() -> list[str]:
    """Stub files whose checked-in text differs from what protoc makes now."""
    return _stale_stubs(write=False)


def regenerate() -> list[str]:
    """Write fresh stubs next to the .proto; returns the files that changed."""
    return _stale_stubs(write=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: regenerate, or with ``--check`` report stale stubs (exit 1)."""
    ap = argparse.ArgumentParser(prog="python -m reshard.service.regen",
                                 description=for_terminal(__doc__).split("\n\n")[0])
    add_version(ap)
    ap.add_argument("--check", action="store_true",
                    help="do not write; exit 1 if the checked-in stubs differ")
    args = ap.parse_args(argv)
    if args.check:
        stale = differences()
        if stale:
            print(f"stale service stubs: {', '.join(stale)}; run "
                  f"`python -m reshard.service.regen`", file=sys.stderr)
            return 1
        print("service stubs match the .proto")
        return 0
    changed = regenerate()
    print(f"regenerated: {', '.join(changed) if changed else 'nothing changed'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
