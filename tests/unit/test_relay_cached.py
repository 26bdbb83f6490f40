"""Round eighteen (issue 62): :class:`~reshard.planner.cells.balance.Loads` reads its
cached answers without a call: :meth:`~Loads.may_relay_end` its host's cached floor,
:meth:`~Loads.relay_chain` of one receiver skips :meth:`~Loads._relay` where the end's
cached answer is False, :meth:`~Loads._relay` picks its relay by one min over its
keys, and :meth:`~Loads.may_relay_ends` asks many at once. Each is checked against the
code it replaces (round seventeen's, below): the same answers, and the same loads,
expectations, moves and caches, keys in the same order."""

from __future__ import annotations

import dataclasses
import random

import pytest

from reshard import Cluster
from reshard.planner.cells.balance import Loads, may_relay_ends
from reshard.planner.values.resources import NIC_IN, NIC_OUT


class _Old(Loads):
    """Round seventeen's methods."""

    def may_relay_end(self, direction, member):  # type: ignore[no-untyped-def]
        key = (direction, member)
        got = self._may_relay.get(key)
        if got is None:
            got = self.expected[(direction, self.nic(member))] > \
                self._floor(direction, self.host(member)) * (1 + 1e-9) + 1
            self._may_relay[key] = got
        return got

    def _floor(self, direction, h):  # type: ignore[no-untyped-def]
        floor = self._least_expected.get((direction, h))
        if floor is None:
            nic = self.nic
            floor = min(self.expected[(direction, nic(d))] for d in self.cluster.hosts[h])
            self._least_expected[(direction, h)] = floor
        return floor

    def _relay(self, direction, member, h, used, nbytes):  # type: ignore[no-untyped-def]
        nic = self.nic
        if not self.may_relay_end(direction, member):
            return None
        load = self.nic_out if direction == NIC_OUT else self.nic_in
        free = [d for d in self.cluster.hosts[h] if d not in used]
        if not free:
            return None
        expected, moved = self.expected, self.moved

        def projected(d):  # type: ignore[no-untyped-def]
            key = (direction, nic(d))
            return expected[key] + moved[key]

        best = min(free, key=lambda d: (projected(d), load[nic(d)], d))
        if nic(best) == nic(member) or load[nic(best)] >= load[nic(member)] or \
                projected(best) + nbytes > projected(member) or \
                not self._crowded(direction, nic(member), nic(best)) or \
                self._shared_binds(projected(member), nbytes):
            return None
        moved[(direction, nic(best))] += nbytes
        moved[(direction, nic(member))] -= nbytes
        self._epoch += 1
        self.shared += nbytes
        used.add(best)
        return best

    def relay_chain(self, root, receivers, nbytes):  # type: ignore[no-untyped-def]
        group = tuple(receivers)
        if len(group) == 1:
            r = group[0]
            if self.cluster.nics_per_host == 1 or self.host(r) == self.host(root):
                return (r,), ()
            used = {root, r, *self.keep_off.get(root, ())}
            out = self._relay(NIC_OUT, root, self.host(root), used, nbytes)
            into = self._relay(NIC_IN, r, self.host(r), used, nbytes)
            relays = tuple(d for d in (out, into) if d is not None)
            return (*relays, r), relays
        return super().relay_chain(root, receivers, nbytes)


def _state(loads: Loads) -> list[object]:
    return [list(getattr(loads, name).items()) for name in
            ("nic_out", "nic_in", "dev_out", "dev_in", "expected", "moved", "_may_relay",
             "_least_expected")] + [loads.shared, loads._epoch]


def _clusters() -> dict[str, Cluster]:
    dgx = Cluster.preset("dgx-h100", 4)
    return {"dgx": dgx, "shared": dataclasses.replace(dgx, shared_bandwidth=1e15),
            "four nics": Cluster(tuple(tuple(range(h * 6, h * 6 + 6)) for h in range(5)),
                                 nics_per_host=3)}


@pytest.mark.parametrize("name", list(_clusters()))
@pytest.mark.parametrize("seed", range(6))
def test_point_to_point_chains_and_caches_are_round_seventeen_s(name, seed):
    cluster = _clusters()[name]
    rng = random.Random(seed)
    devices = list(cluster.devices)
    new, old = Loads(cluster), _Old(cluster)
    for _ in range(rng.randrange(3, 30)):  # uneven expectations
        holders = frozenset(rng.sample(devices, rng.randrange(1, 3)))
        needers = frozenset(rng.sample(devices, rng.randrange(1, 6)))
        nbytes = rng.choice([1 << 10, 1 << 20, 3 << 20])
        new.expect(holders, needers, nbytes)
        old.expect(holders, needers, nbytes)
    for loads in (new, old):
        loads.keep_off[devices[0]] = frozenset(devices[1:4])
    relays = 0
    for _ in range(300):
        root, r = rng.sample(devices, 2)
        nbytes = rng.choice([1 << 10, 1 << 20, 3 << 20, 1 << 24])
        if rng.random() < 0.1:
            d = rng.choice(devices)
            direction = rng.choice([NIC_OUT, NIC_IN])
            assert new.may_relay_end(direction, d) == old.may_relay_end(direction, d)
        got = new.relay_chain(root, (r,), nbytes)
        assert got == old.relay_chain(root, (r,), nbytes)
        relays += bool(got[1])
        new.charge(root, got[0], nbytes)
        old.charge(root, got[0], nbytes)
        assert _state(new) == _state(old)
    ask = rng.sample(devices, len(devices) // 2) + devices
    for direction in (NIC_OUT, NIC_IN):
        assert may_relay_ends(new, direction, ask) == [old.may_relay_end(direction, d)
                                                      for d in ask]
        assert _state(new) == _state(old)
    assert relays  # some relays taken
