"""Regular clusters (whole hosts of equal GPUs) in the three variants the route-form
tests check a fast path on: a preset, relay pieces, and two NICs a host (tests only)."""

from __future__ import annotations

import dataclasses

from reshard.cluster import Cluster


def regular_clusters(hosts: int, gpus: int) -> dict[str, Cluster]:
    """``hosts`` hosts of ``gpus`` GPUs: dgx-h100's preset, one NIC a GPU with relay
    pieces, and two NICs a host."""
    plain = Cluster(tuple(tuple(range(h * gpus, (h + 1) * gpus)) for h in range(hosts)),
                    nics_per_host=gpus)
    return {"preset": Cluster.preset("dgx-h100", hosts),
            "pieces": dataclasses.replace(plain, relay_piece=1 << 16),
            "two-nics": dataclasses.replace(plain, nics_per_host=2)}
