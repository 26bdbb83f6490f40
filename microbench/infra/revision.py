"""Another git revision of reshard, importable beside this one: for benchmarks that
compare today's code with an older commit's (issue goals are often "N times faster
than at the issue"), in processes of their own, alternated with today's.

:func:`revision_path` extracts the revision's tree (``git archive``) into a folder laid
out as the installed package (the top-level planner/, comm/, pipeline/, microbench/
folders linked in as ``reshard.<name>``, as setup.py's ``package_dir`` installs them),
with a ``sitecustomize`` that removes this checkout's editable-install finder, so that a
process started with ``PYTHONPATH=<path>`` imports the old ``reshard``.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

SUBPACKAGES = ("planner", "comm", "pipeline", "microbench")
"""Top-level folders that install as ``reshard.<name>`` (setup.py's ``package_dir``)."""

SITECUSTOMIZE = """\
import sys
def _editable(item):
    return str(getattr(item, "__module__", "")).startswith("__editable__")
sys.meta_path[:] = [f for f in sys.meta_path if not _editable(f)]
sys.path_hooks[:] = [h for h in sys.path_hooks if not _editable(h)]
"""


def checkout_root() -> Path:
    """The git checkout this reshard is imported from (an editable install's source)."""
    import reshard

    root = Path(reshard.__file__).resolve().parent.parent
    if not (root / ".git").exists():
        raise SystemExit(f"reshard is imported from {root}, which is not a git checkout; "
                         f"comparing with another revision needs one (pip install -e .)")
    return root


@contextlib.contextmanager
def revision_path(rev: str) -> Iterator[str]:
    """A PYTHONPATH entry that imports ``rev``'s reshard (removed on exit)."""
    root = checkout_root()
    try:
        archive = subprocess.run(["git", "-C", str(root), "archive", rev],
                                 capture_output=True, check=True, timeout=120).stdout
    except subprocess.CalledProcessError as e:
        raise SystemExit(f"git archive {rev} failed: {e.stderr.decode().strip()}") from None
    with tempfile.TemporaryDirectory(prefix="reshard-rev-") as tmp:
        tree = Path(tmp, "tree")
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(tree, filter="data")
        pkg = Path(tmp, "path")
        (pkg / "reshard").mkdir(parents=True)
        for item in (tree / "reshard").iterdir():
            (pkg / "reshard" / item.name).symlink_to(item)
        for sub in SUBPACKAGES:
            if (tree / sub).is_dir() and not (pkg / "reshard" / sub).exists():
                (pkg / "reshard" / sub).symlink_to(tree / sub)
        (pkg / "sitecustomize.py").write_text(SITECUSTOMIZE)
        yield str(pkg)


def run_python(code: str, args: list[str], path: str | None = None,
               timeout: float = 600) -> str:
    """``python -c code *args`` in a fresh process (``path``: first on its PYTHONPATH,
    e.g. :func:`revision_path`'s), its stdout. It runs in a neutral folder: ``-c`` puts
    the working directory first on ``sys.path``, and a checkout's ``reshard/`` folder
    there would shadow both the installed package and ``path``."""
    env = dict(os.environ)
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (path, env.get("PYTHONPATH")) if p)
    run = subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                         text=True, timeout=timeout, env=env,
                         cwd=path or tempfile.gettempdir(), check=False)
    if run.returncode:
        raise SystemExit(f"the benchmark process failed:\n{run.stderr[-2000:]}")
    return run.stdout
