"""The bytes point-to-point rows move, summed per device and per NIC once.

A work list adds its point-to-point rows' bytes in bulk twice: as expected NIC demand
(:meth:`Loads.expect`) and as the loads they charge (:meth:`Loads.charge`), each a
:func:`numpy.bincount` of the rows' bytes by sender, receiver and (host-crossing rows
only) their NICs. :func:`end_sums` finds the four sums once, per device first: each
device's bytes out and in, its host-crossing bytes out and in, and those summed per
NIC over its devices. Every byte count is a whole number and their total is below
2**53 (:data:`~reshard.planner.cells.whole_sums.EXACT`), so every partial sum is
exact and the sums are the row-by-row sums bit for bit, in any order; where the total
is not, :func:`end_sums` sums row by row (:func:`row_sums`, in the rows' order).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from reshard.planner.cells.whole_sums import EXACT


@dataclass(frozen=True, eq=False)
class EndSums:
    """Bytes per index (float64, as :func:`numpy.bincount` with weights gives them):
    sent and received per device, sent and received across hosts per NIC."""

    dev_out: np.ndarray
    dev_in: np.ndarray
    nic_out: np.ndarray
    nic_in: np.ndarray


def end_sums(root: np.ndarray, recv: np.ndarray, nbytes: np.ndarray, host: np.ndarray,
             nic: np.ndarray) -> EndSums:
    """The sums of ``nbytes`` (int64, one per row) by ``root`` and by ``recv``, and of
    the host-crossing rows' (``host`` of each device) by the ``nic`` of each end: per
    device first where every count is whole and non-negative and their total below
    :data:`EXACT` (the same sums), else row by row (:func:`row_sums`)."""
    weights = nbytes.astype(np.float64)  # the values bincount's weights take
    if len(weights) and not (float(weights.min()) >= 0 and float(weights.sum()) < EXACT):
        return row_sums(root, recv, nbytes, host, nic)
    cross = np.where(host[root] != host[recv], weights, 0.0)
    out_dev = np.bincount(root, weights=cross, minlength=len(nic))
    in_dev = np.bincount(recv, weights=cross, minlength=len(nic))
    return EndSums(np.bincount(root, weights=weights), np.bincount(recv, weights=weights),
                   np.bincount(nic, weights=out_dev), np.bincount(nic, weights=in_dev))


def row_sums(root: np.ndarray, recv: np.ndarray, nbytes: np.ndarray, host: np.ndarray,
             nic: np.ndarray) -> EndSums:
    """:func:`end_sums` row by row, in the rows' order."""
    cross = host[root] != host[recv]
    return EndSums(np.bincount(root, weights=nbytes), np.bincount(recv, weights=nbytes),
                   np.bincount(nic[root[cross]], weights=nbytes[cross]),
                   np.bincount(nic[recv[cross]], weights=nbytes[cross]))
