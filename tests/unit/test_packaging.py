"""What a planner-only user installs, and the errors when an optional extra is missing."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

from reshard.comm.backend import BackendKind
from reshard.comm.launchers import start_group
from reshard.comm.launchers.base import LauncherKind
from reshard.errors import MissingDependencyError

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_planner_imports_and_plans_without_ray_or_torch():
    # a fresh interpreter in which ray, torch and cupy cannot be imported
    code = (
        "import sys\n"
        "for m in ('ray', 'torch', 'cupy'): sys.modules[m] = None\n"
        "import reshard\n"
        "from reshard import DeviceMesh, Layout, plan\n"
        "src = Layout(DeviceMesh((2, 2)), 'S0R')\n"
        "dst = Layout(DeviceMesh((2, 2), devices=range(4, 8)), 'RS0')\n"
        "p = plan((8, 8), 'float32', src, dst)\n"
        "assert p.estimate() >= p.lower_bound() > 0\n"
        "print(sorted(m for m in ('ray', 'torch', 'cupy') if sys.modules.get(m)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True,
                         text=True,
                         timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_ray_launcher_without_ray_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    monkeypatch.delitem(sys.modules, "reshard.comm.launchers.ray", raising=False)
    with pytest.raises(MissingDependencyError, match=r"reshard\[ray\]"):
        start_group(BackendKind.GLOO, LauncherKind.RAY, [0], None, 1.0)


def test_package_is_typed():
    assert (ROOT / "reshard" / "py.typed").is_file()
    setup = (ROOT / "setup.py").read_text(encoding="utf-8")
    assert '"py.typed"' in setup
    requires = setup.split("install_requires=[", 1)[1].split("]", 1)[0]
    assert "ray" not in requires and "torch" not in requires
