"""The clusters and box of the chain-pricing tests (test_chain_columns, test_reduce_chains):
a regular preset, one that pipelines relay pieces, and hosts of uneven sizes."""
from reshard import Cluster

CLUSTERS = {
    "regular": Cluster.preset("dgx-h100", 16),
    "pieces": Cluster.regular(16, 8, relay_piece=1 << 16),
    "odd hosts": Cluster.from_hosts([range(8), range(8, 11), range(11, 24),
                                     range(24, 128)]),
}
BOX = ((0, 64), (0, 32))
