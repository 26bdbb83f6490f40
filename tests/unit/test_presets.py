"""The machine types' figures, read from ``reshard/core/presets.toml``."""

from __future__ import annotations

import pytest

from reshard import Cluster
from reshard.errors import ClusterError
from reshard.presets import GBIT, GBYTE, PAPER_PRESET, PRESETS, bandwidth, lookup, read


def test_units_are_exact():
    # decimal arithmetic, rounded once: the same floats as the products written in code
    assert bandwidth("10 Gbit/s") == 10 * GBIT
    assert bandwidth("28800 Gbit/s") == 72 * 400 * GBIT
    assert bandwidth("150 GB/s") == 150 * GBYTE
    assert bandwidth("0.5 GB/s") == 5e8
    for bad in ("150 GB", "150GB/s", "fast Gbit/s", ""):
        with pytest.raises(ClusterError):
            bandwidth(bad)


def test_the_papers_cluster_and_a_rail_optimised_one():
    paper = PRESETS[PAPER_PRESET]
    assert lookup("paper") is paper
    # Zhuang et al.: 4 V100 a host over NVLink, a 10 Gbit/s network
    assert (paper.devices_per_host, paper.nic_bandwidth, paper.intra_bandwidth) == (
        4, 1.25e9, 150e9)
    assert (paper.latency, paper.intra_latency, paper.nics_per_host) == (30e-6, 5e-6, 1)
    h100 = PRESETS["dgx-h100"]
    assert (h100.devices_per_host, h100.nics_per_host, h100.nic_bandwidth) == (8, 8, 400e9)
    assert Cluster.preset("dgx-h100", 2).nics_per_host == 8
    for figures in PRESETS.values():
        assert figures.source and figures.copy_bandwidth > figures.intra_bandwidth > 0
        # a preset's measured cast rate (or 0) reaches the clusters built from it
        assert Cluster.preset(figures.name, 1).cast_bandwidth == figures.cast_bandwidth


def test_a_table_read_from_text_and_its_errors():
    text = """
["lab"]
devices_per_host = 2
intra_bandwidth = "20 GB/s"
nic_bandwidth = "25 Gbit/s"
latency_us = 12.5
intra_latency_us = 2
copy_bandwidth = "100 GB/s"
source = "our rack"
"""
    (lab,) = read(text).values()
    assert (lab.name, lab.latency, lab.nic_bandwidth, lab.nics_per_host) == (
        "lab", 12.5e-6, 25 * GBIT, 1)
    assert lab.cast_bandwidth == 0.0  # not measured: a cast is free
    (cast,) = read(text + 'cast_bandwidth = "1800 GB/s"\n').values()
    assert cast.cast_bandwidth == 1800 * GBYTE
    with pytest.raises(ClusterError, match="'lab' has no source"):
        read(text.replace('source = "our rack"', ""))
    with pytest.raises(ClusterError, match="not a number of microseconds"):
        read(text.replace("latency_us = 12.5", 'latency_us = "fast"'))
    with pytest.raises(ClusterError, match="unknown cluster preset 'lab'"):
        lookup("lab")
