"""The device engine by task kind (docs/architecture.md, "a new task kind"): every kind
of :class:`~reshard.planner.values.tasks.TaskKind` has its class in
:data:`reshard.comm.engine.kinds.KINDS` with its three phases; the step loop holds no
kind's code; the data plane's top-level modules stay few (the rest are in folders)."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from reshard.comm.engine import execution, kinds
from reshard.planner.values.tasks import TaskKind

from .test_moved_modules import MOVED

COMM = Path(execution.__file__).resolve().parents[1]


def test_every_task_kind_has_its_class_with_its_phases():
    assert set(kinds.KINDS) == set(TaskKind)
    for kind, handler in kinds.KINDS.items():
        own = {name for klass in type(handler).__mro__[:-1] if klass is not kinds.Kind
               for name in vars(klass)}
        assert "prepare" in own, f"{kind}: no prepare"
        if kind is not TaskKind.COPY:  # a copy is done in prepare: nothing to issue
            assert {"issue", "unpack"} <= own, f"{kind}: lacks issue or unpack"
    assert kinds.KINDS[TaskKind.SEND].issue.__func__ is not \
        kinds.KINDS[TaskKind.BROADCAST].issue.__func__  # type: ignore[attr-defined]


def test_the_step_loop_names_no_task_kind():
    """Execution dispatches on the kind through KINDS only: it names none itself."""
    source = inspect.getsource(execution.Execution)
    names = {n.attr for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Attribute)}
    assert not names & {k.name for k in TaskKind}, "the step loop names a task kind"


def test_comm_shows_few_top_level_modules():
    """At most 8 modules at the top of comm/ (its folders hold the rest); the old paths
    of moved modules import from the aliases in comm/_moved/ for one release."""
    top = sorted(p.stem for p in COMM.glob("*.py") if p.stem != "__init__")
    assert len(top) <= 8, top
    moved = sorted(p.stem for p in (COMM / "_moved").glob("*.py") if p.stem != "__init__")
    assert moved == sorted(old.rpartition(".")[2] for old in MOVED
                           if old.startswith("reshard.comm."))
