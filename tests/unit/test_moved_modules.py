"""Moved modules (the planner by stage, issue 46; the data plane's engine and bootstrap
folders, issue 65): the modules the documentation named before a move still import from
their old paths for one release, with a DeprecationWarning, and give the moved module's
own objects."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

MOVED = {"reshard.planner.scales": "reshard.planner.values.scales",
         "reshard.planner.coalesce": "reshard.planner.schedule.coalesce",
         "reshard.planner.verify": "reshard.planner.costing.verify",
         **{f"reshard.comm.{m}": f"reshard.comm.engine.{m}"
            for m in ("execution", "steps", "step_ops", "packing", "pitched", "box_batch",
                      "derived")},
         **{f"reshard.comm.{m}": f"reshard.comm.bootstrap.{m}"
            for m in ("rendezvous", "store_rendezvous", "sockets", "link_key")},
         "reshard.microbench.infra.testbed": "reshard.testbed",
         "reshard.planner.search.passes": "reshard.planner.passes.stages",
         **{f"reshard.planner.search.{m}": f"reshard.planner.passes.{m}"
            for m in ("allreduce", "twins")}}


@pytest.mark.parametrize("old", sorted(MOVED))
def test_old_path_warns_and_gives_the_moved_module(old):
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=MOVED[old]):
        alias = importlib.import_module(old)
    new = importlib.import_module(MOVED[old])
    public = getattr(new, "__all__", None)
    assert public, f"{MOVED[old]} declares no __all__"
    for name in public:
        assert getattr(alias, name) is getattr(new, name)
    with pytest.raises(AttributeError):
        alias.no_such_name  # noqa: B018


CORE = ("errors", "choice", "dtypes", "spec", "mesh", "layout", "cluster", "bits", "casting",
        "lru", "helptext", "tables", "cliargs", "version", "packed", "darray", "gcpause",
        "lazy", "unique_ids", "presets", "kernels", "kernels.cast_source",
        "kernels.cast_geometry", "kernels.cast_launch")
"""The core layer's modules (reshard/core/), each also imported by its short path."""


def test_the_cores_short_paths_are_the_same_modules_without_a_warning():
    """In a fresh interpreter, before anything imported reshard.core, and with every
    warning an error: ``reshard.X`` is ``reshard.core.X`` itself (one module object: a
    class, a monkeypatch or a cache is the same through either name)."""
    code = ("import importlib, sys, warnings\n"
            "warnings.simplefilter('error')\n"
            f"for m in {CORE!r}:\n"
            "    old = importlib.import_module('reshard.' + m)\n"
            "    assert old is importlib.import_module('reshard.core.' + m), m\n"
            "    assert sys.modules['reshard.' + m] is old, m\n"
            "from reshard.errors import PlanError\n"
            "from reshard.core.errors import PlanError as P\n"
            "assert PlanError is P and PlanError.__module__ == 'reshard.core.errors'\n"
            "import reshard.layout, reshard.core.layout\n"
            "assert reshard.layout is reshard.core.layout\n"
            "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


def test_the_package_shows_few_top_level_modules():
    """At most 12 modules at the top of reshard/ (the core layer in core/, the old paths
    answered from _moved/)."""
    import reshard

    top = sorted(p.stem for p in Path(reshard.__file__).parent.glob("*.py")
                 if p.stem != "__init__")
    assert len(top) <= 12, top
    assert not set(top) & {m for m in CORE if "." not in m}


def test_the_testbeds_old_command_still_runs():
    """``python -m reshard.microbench.infra.testbed`` runs the testbed's ``main`` as
    ``python -m reshard.testbed`` does."""
    runs = [subprocess.run([sys.executable, "-m", m, "--check"], capture_output=True,
                           text=True, timeout=120, check=False)
            for m in ("reshard.testbed", "reshard.microbench.infra.testbed")]
    assert runs[0].stdout.startswith("available: ")
    assert [(r.returncode, r.stdout) for r in runs[1:]] == [(runs[0].returncode, runs[0].stdout)]


def test_the_short_paths_have_current_type_stubs():
    """``reshard/<name>.pyi`` re-exports what ``reshard.core.<name>`` defines
    (scripts/short_path_stubs.py): a type checker, which never sees ``_moved/``, follows
    ``from reshard.cluster import Cluster`` as Python does."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import short_path_stubs
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    assert short_path_stubs.main(["--check"]) == 0
    assert set(short_path_stubs.short_paths()) == {m for m in CORE if "." not in m} - {
        "kernels"}


def test_a_users_type_checker_sees_the_core_types_by_their_short_paths(tmp_path):
    """mypy on a user's file that imports the documented short paths finds them and
    their real types (without the stubs: import-not-found, or Any)."""
    user = tmp_path / "user.py"
    user.write_text("from reshard.cluster import Cluster\n"
                    "from reshard.errors import PlanError\n"
                    "reveal_type(Cluster.regular(1, 2))\n"
                    "reveal_type(PlanError('x'))\n")
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-site-packages", "--follow-imports=silent",
         "--no-incremental", "--config-file", "/dev/null", str(user)],
        capture_output=True, text=True, timeout=300, check=False, cwd=tmp_path,
        env={**os.environ, "MYPYPATH": str(ROOT)})
    assert 'Revealed type is "reshard.core.cluster.Cluster"' in out.stdout, out.stdout
    assert 'Revealed type is "reshard.core.errors.PlanError"' in out.stdout, out.stdout
