"""Benchmarks compare today's code with an older revision's: the revision's tree,
extracted beside this checkout, is what a process given its path imports."""

from __future__ import annotations

import json
import subprocess

import pytest

from reshard.microbench.infra.revision import checkout_root, revision_path, run_python

WHERE = "import json, reshard, reshard.planner.ir as ir; print(json.dumps([reshard.__file__, ir.__file__]))"


def test_a_revision_imports_from_its_own_tree():
    root = checkout_root()
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()
    with revision_path(head) as path:
        old = json.loads(run_python(WHERE, [], path))
        assert all(f.startswith(path) for f in old)  # the package and its linked subpackages
    new = json.loads(run_python(WHERE, []))
    assert not any(f.startswith(path) for f in new)
    with pytest.raises(SystemExit, match="git archive no-such-rev failed"), \
            revision_path("no-such-rev"):
        pass
