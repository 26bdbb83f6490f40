"""Ray's advice to turn token authentication off (``RAY_AUTH_MODE=disabled``), which
contradicts reshard's docs, does not reach the user of an embedded Ray; reshard says
once what it is instead."""

from __future__ import annotations

import logging

import pytest

ray_launcher = pytest.importorskip("reshard.comm.launchers.ray")


def _record(msg: str) -> logging.LogRecord:
    return logging.LogRecord(ray_launcher._TOKEN_LOGGER, logging.WARNING, __file__, 1, msg,
                             None, None)


def test_only_the_opt_out_advice_is_dropped_and_only_while_ray_starts(caplog):
    advice = ("Token authentication is enabled for this Ray cluster. Set RAY_AUTH_MODE="
              "disabled to opt out.")
    source = logging.getLogger(ray_launcher._TOKEN_LOGGER)
    caplog.set_level(logging.INFO, logger="reshard")
    with ray_launcher._token_advice_explained():
        assert not source.filter(_record(advice))
        assert source.filter(_record("Generated new authentication token"))
    assert source.filter(_record(advice))  # removed again afterwards
    said = [r.getMessage() for r in caplog.records if r.name == "reshard"]
    assert len(said) == 1 and "token authentication" in said[0] and "keep it on" in said[0]
