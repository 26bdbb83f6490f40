"""Route forms up to the places inside each host (issue 62, round twelve).

:func:`~reshard.planner.costing.route_forms.relabeled` finds a route once per form: a
task's hosts renumbered in the order its devices first name them, each device keeping
its place in its host. The trees of one plan differ mostly in the order of the places
inside their hosts (a chain moves one member of a host to its end), so some 400 such
forms are a handful once the places of each host are renumbered too.

Where each device of a host has a NIC of its own (or the host has one NIC for all of
them), a bijection of a host's places moves each device's link and NIC together:
every resource goes to one of the same kind and capacity, a hop crosses hosts after
the move exactly where it did before, and every sender feeds as many children. A
broadcast's or reduction's route is its edges' hops in order and its latency is
summed edge by edge from which edges cross hosts and how many children each sender
feeds, so the route of a task so moved is the task's route moved resource by resource,
with the same latency (the same floats, summed in the same order).

So a form row (host ranks, places kept) is renumbered once more, each host's places in
the order the row first names them (:meth:`PlaceForms.probe`): forms of one such
*place form* have routes that are each other's moved, and a form met after its place
form is numbered from that form's route instead of searched (:meth:`PlaceForms.derived`).
Pure: the memo is the caller's (the same dict as the forms', under keys of their own).
"""

from __future__ import annotations

import numpy as np

from reshard.planner.costing.route_forms import FORM_STRIDE, FormMemo
from reshard.planner.costing.sampled_keys import SampledKey, every
from reshard.planner.values.resources import KIND_CODE, NIC_IN

Probe = tuple[SampledKey, np.ndarray, np.ndarray]
"""A form's place form (:meth:`PlaceForms.probe`): its key, and the tables that move
the form's devices to the place form's and back (indexed by device)."""

_LAST_NIC = KIND_CODE[NIC_IN]
"""Kinds coded at most this are a NIC's (:data:`~reshard.planner.values.resources.
KINDS`' order)."""


class PlaceForms:
    """Renumbering of places inside hosts on a regular cluster of ``devices`` a host
    whose devices' NICs (``nic_places``: host 0's devices' NICs, by place) are each a
    device's own or all one (:meth:`of`)."""

    def __init__(self, devices: int, nic_places: np.ndarray, own: bool):
        self.devices = devices
        self.own = own  # each device its own NIC (else: one NIC a host)
        self.nic_place = nic_places  # by a device's place, its NIC's
        place_of = np.full(int(nic_places.max()) + 1, -1, dtype=np.int64)
        place_of[nic_places] = np.arange(len(nic_places), dtype=np.int64)
        self.place_of_nic = place_of  # by a NIC's place, its device's (own NICs)

    @classmethod
    def of(cls, step: tuple[int, int], nic: np.ndarray) -> PlaceForms | None:
        """The renumbering on a regular cluster (``step``: devices and NICs a host,
        ``nic``: each device's NIC, host by host), or None where a renumbering of a
        host's places would split or join devices that share a NIC (some NICs shared
        by some of a host's devices, not all)."""
        devices = step[0]
        places = np.asarray(nic[:devices], dtype=np.int64)
        distinct = len(np.unique(places))
        if distinct == devices:
            return cls(devices, places, True)
        if distinct == 1:
            return cls(devices, places, False)
        return None

    def probe(self, form: tuple[object, ...], row: np.ndarray) -> Probe:
        """The place form of ``form`` (a :func:`~reshard.planner.costing.route_forms.
        form_key`), whose form row is ``row`` (devices numbered by host rank): each
        host's places renumbered in the order the row first names them. Its key and the
        tables moving a device of the form to the place form's and back."""
        g, n = self.devices, len(row)
        first = np.full(int(row.max()) + 1, n, dtype=np.int64)
        np.minimum.at(first, row, np.arange(n, dtype=np.int64))
        seq = row[first[row] == np.arange(n)]  # each device once, in the order first named
        hosts = seq // g
        if len(hosts) > 1 and bool((hosts[1:] < hosts[:-1]).any()):  # host by host
            seq = seq[np.argsort(hosts, kind="stable")]
            hosts = seq // g
        # each device's rank among its host's: its place less its host's first place
        new = np.ones(len(seq), dtype=bool)
        new[1:] = hosts[1:] != hosts[:-1]
        start = np.maximum.accumulate(np.where(new, np.arange(len(seq)), 0))
        to = np.full(len(first), -1, dtype=np.int64)
        to[seq] = hosts * g + (np.arange(len(seq), dtype=np.int64) - start)
        back = np.full(len(first), -1, dtype=np.int64)
        back[to[seq]] = seq
        placed = to[row].tobytes()
        head, tail = ("places", *form[1:5]), form[6:]
        key = SampledKey.of((*head, placed, *tail),
                            (*head, every(placed, FORM_STRIDE), *tail))
        return key, to, back

    def derived(self, form: tuple[object, ...], probe: Probe, memo: FormMemo
                ) -> tuple[np.ndarray, np.ndarray, float] | None:
        """The memo entry of ``form`` (its place form ``probe``) numbered from its
        place form's (put in ``memo``), or None where ``memo`` has no route of that
        place form yet."""
        got = memo.get(probe[0])
        if got is None:
            return None
        base, ranked_span, lat = got
        entry = (self._moved(base, ranked_span[0], probe[2]), ranked_span, lat)
        memo[form] = entry
        return entry

    def remember(self, form: tuple[object, ...], probe: Probe, memo: FormMemo) -> None:
        """Put the route of ``form`` (in ``memo``, found) in ``memo`` as its place
        form's (``probe``)."""
        base, ranked_span, lat = memo[form]
        memo[probe[0]] = (self._moved(base, ranked_span[0], probe[1]), ranked_span, lat)

    def _moved(self, base: np.ndarray, ranked: np.ndarray, table: np.ndarray
               ) -> np.ndarray:
        """A form's codes less their hosts' part (``base``; ``ranked``: each code's
        host's rank) with each device moved by ``table`` inside its host (a NIC with
        its device where each has its own, else kept)."""
        g = self.devices
        kind = base & 7
        place = base >> 3  # a device's place in its host, or a NIC's
        nics = kind <= _LAST_NIC
        at = ranked * g
        if self.own:  # a NIC moves with its device
            place = np.where(nics, self.place_of_nic.take(place, mode="clip"), place)
            moved = table[at + place] - at
            assert (moved >= 0).all()  # every device a route crosses is one its row names
            moved = np.where(nics, self.nic_place[moved], moved)
        else:  # the host's one NIC stays
            moved = place.copy()
            devs = np.flatnonzero(~nics)
            moved[devs] = table[at[devs] + place[devs]] - at[devs]
            assert (moved >= 0).all()
        codes: np.ndarray = (moved << 3) | kind
        return codes


__all__ = ["PlaceForms", "Probe"]
