"""Moved modules (the planner by stage, issue 46; the data plane's engine and bootstrap
folders, issue 65): the modules the documentation named before a move still import from
their old paths for one release, with a DeprecationWarning, and give the moved module's
own objects."""

from __future__ import annotations

import importlib
import sys

import pytest

MOVED = {"reshard.planner.scales": "reshard.planner.values.scales",
         "reshard.planner.coalesce": "reshard.planner.schedule.coalesce",
         "reshard.planner.verify": "reshard.planner.costing.verify",
         **{f"reshard.comm.{m}": f"reshard.comm.engine.{m}"
            for m in ("execution", "steps", "step_ops", "packing", "pitched", "box_batch",
                      "derived")},
         **{f"reshard.comm.{m}": f"reshard.comm.bootstrap.{m}"
            for m in ("rendezvous", "store_rendezvous", "sockets", "link_key")}}


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
