"""A chain's host segments (:func:`chain_cuts.segments`, issue 62 round seven): a long
chain's hosts read from the cluster's map at once where the host function is the
cluster's own ``host_of`` equal the hosts the function gives one call each, and the
segments equal the ones cut device by device; a device the cluster lacks is named in
``host_of``'s own error."""

from __future__ import annotations

import itertools
import random

import pytest

from reshard import Cluster
from reshard.cluster import ClusterError
from reshard.planner.cells import chain_cuts
from reshard.planner.values.tasks import Task, TaskKind

GPUS, HOSTS = 8, 30


def _cut(chain: list[int], host) -> list[list[int]]:  # type: ignore[no-untyped-def]
    """The chain cut where it changes host, device by device (the rule itself)."""
    segs = [[chain[0]]]
    for a, b in itertools.pairwise(chain):
        if host(a) == host(b):
            segs[-1].append(b)
        else:
            segs.append([b])
    return segs


@pytest.mark.parametrize("seed", range(4))
def test_long_chain_segments_from_the_cluster_map(seed):
    rng = random.Random(seed)
    shuffled = list(range(GPUS * HOSTS))
    rng.shuffle(shuffled)  # hosts of scattered device ids: no arithmetic rule
    cluster = Cluster(tuple(tuple(shuffled[h * GPUS:(h + 1) * GPUS]) for h in range(HOSTS)))
    devices = rng.sample(range(GPUS * HOSTS), rng.randint(chain_cuts.ARRAY_DEVICES + 1, 200))
    devices.sort(key=lambda d: (cluster.host_of(d), rng.random()))
    if seed % 2:  # enter hosts again
        i, j = sorted(rng.sample(range(1, len(devices)), 2))
        devices[i:j] = reversed(devices[i:j])
    chain = Task(TaskKind.BROADCAST, 0, ((0, 64),), devices[0], tuple(devices[1:]), 64)
    want = _cut(devices, cluster.host_of)
    assert chain_cuts.hosts_of(devices, cluster.host_of).tolist() == list(map(cluster.host_of,
                                                                        devices))
    assert chain_cuts.segments(chain, cluster.host_of) == want
    assert chain_cuts.segments(chain, lambda d: cluster.host_of(d)) == want  # one call each


def test_a_device_the_cluster_lacks_is_named():
    cluster = Cluster.regular(2, 4)
    with pytest.raises(ClusterError, match="device 99"):
        chain_cuts.hosts_of([0, 1, 99], cluster.host_of)
