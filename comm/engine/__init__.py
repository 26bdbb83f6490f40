"""The device engine: one device's execution of its program, step by step.

``steps.py`` lays a program out as steps and prepares it on a backend rank
(:class:`~reshard.comm.engine.steps.LoadedProgram`); ``execution.py`` holds the sources
and the step loop (:class:`~reshard.comm.engine.execution.Execution`); ``kinds.py`` one
small class per task kind with its three phases (prepare, issue, unpack) and the table
the loop dispatches through (``KINDS``); ``message.py`` a coalesced message's payloads;
``step_ops.py`` what a task holds while its step runs; ``packing.py``, ``pitched.py`` and
``box_batch.py`` the box copies (a GPU's in one launch per step); ``derived.py`` the
sources a plan derives (a scaled cast's amax and scales).
"""
