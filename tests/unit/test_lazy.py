"""Names of ``reshard`` and ``reshard.service`` that pull in the data plane or gRPC load
when first asked for, through one helper (reshard.lazy)."""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_lazy_names_load_on_first_use_and_unknown_ones_are_refused_by_package():
    code = ("import sys, reshard, reshard.service as s\n"
            "before = {m for m in ('reshard.runtime', 'reshard.service.client') if m in sys.modules}\n"
            "assert reshard.Runtime.__module__ == 'reshard.runtime'\n"
            "assert s.Client.__module__ == 'reshard.service.client'\n"
            "print(sorted(before))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout.strip() == "[]"  # neither was imported before it was asked for
    import reshard
    import reshard.service

    with pytest.raises(AttributeError, match="module 'reshard' has no attribute 'Runtimes'"):
        reshard.Runtimes  # noqa: B018
    with pytest.raises(AttributeError, match=r"'reshard\.service' has no attribute 'Clients'"):
        reshard.service.Clients  # noqa: B018
