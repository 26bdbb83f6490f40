"""Entry point of reshard's worker processes and fork server (see
:mod:`reshard.comm.launchers.spawn`): ``serve CONTROL_FD DRIVER_PID [MODULE ...]`` runs
a fork server, ``run COMMANDS_FD RESULTS_FD`` one worker. Started by the launcher with
``python -c``, so the caller's ``__main__`` is never imported."""

from __future__ import annotations

import os
import sys


def main(argv: list[str] | None = None) -> None:
    """Dispatch on the first argument."""
    from reshard.comm.launchers import spawn

    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["serve"] and len(args) >= 3:
        spawn.serve(int(args[1]), int(args[2]), args[3:])
        # the driver closed the control socket: exit now, skipping the interpreter's
        # teardown of what the server preloaded (torch's took 1-2 s on a loaded machine,
        # which a Runtime's close and the service's grace waited for)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    elif args[:1] == ["run"] and len(args) == 3:
        spawn.run(int(args[1]), int(args[2]))
    else:
        sys.exit("usage: serve CONTROL_FD DRIVER_PID [MODULE ...] | run COMMANDS_FD RESULTS_FD "
                 "(started by reshard's process launcher, not by hand)")
