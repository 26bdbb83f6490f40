"""A short chain to several other hosts ordered and walked at once
(planner/cells/short_chain.py, issue 62 round seven): its chain is
:meth:`Loads.chain`'s, its quick answer the whole walk's (every boundary asked), and
``relay_chain`` with it answers and leaves the loads as the chain-then-walk path does;
on random load tables whose values tie, with and without expectations that let some
boundaries relay, on one NIC per device and on four per host."""

from __future__ import annotations

import random

import pytest

from reshard import Cluster
from reshard.planner.cells import balance, short_chain
from reshard.planner.values.resources import NIC_OUT
from tests.unit._twin_loads import twin_loads

CLUSTERS = [Cluster.preset("dgx-h100", 16)]  # a NIC per device: relays possible


def _state(loads: balance.Loads) -> tuple[object, ...]:
    def table(t: dict) -> list:
        return sorted((k, v) for k, v in t.items() if v)
    return (table(loads.nic_out), table(loads.nic_in), table(loads.dev_out),
            table(loads.dev_in), table(loads.moved), loads.shared, loads._epoch)


def _receivers(rng: random.Random, cluster: Cluster, root: int) -> list[int]:
    hosts = rng.sample(range(len(cluster.hosts)), rng.choice([1, 2, 3, 4, 6]))
    if rng.random() < 0.2:  # the root's host among them
        hosts[0] = cluster.host_of(root)
    pool = [d for h in hosts for d in cluster.hosts[h] if d != root]
    per = rng.choice([1, 2, 8])
    chosen = [d for h in hosts for d in rng.sample(
        [d for d in cluster.hosts[h] if d != root], min(per, len(cluster.hosts[h]) - 1))]
    return chosen if rng.random() < 0.7 else rng.sample(pool, rng.randint(2, min(20, len(pool))))


@pytest.mark.parametrize("seed", range(5))
def test_a_short_chain_to_other_hosts_is_the_chain_then_the_walk(seed, monkeypatch):
    rng = random.Random(seed)
    cluster = CLUSTERS[0]
    quick = walked = declined = 0
    for trial in range(10):
        fast, slow = twin_loads(rng, cluster, crowded=trial % 2 == 1)
        for _ in range(12):
            root = rng.randrange(len(cluster.devices))
            leaving = [d for d in cluster.devices if fast.may_relay_end(NIC_OUT, d)]
            if leaving and rng.random() < 0.4:  # a root that may relay out
                root = rng.choice(leaving)
            receivers = sorted(set(_receivers(rng, cluster, root)))
            nbytes = rng.choice([500, 1 << 20])
            got = short_chain.remote_chain(fast.copy(), root, receivers)
            if got is None:
                declined += 1
            else:
                chain, answer = got
                assert chain == slow.copy().chain(root, receivers)
                whole = slow.copy()._relay_walk(root, chain, nbytes, quick=False)
                if answer is None:
                    walked += 1
                else:
                    quick += 1
                    assert whole == (answer, ())
            mine = fast._relay_through(root, tuple(receivers), nbytes)
            monkeypatch.setattr(short_chain, "remote_chain", lambda *args: None)
            monkeypatch.setattr(balance, "remote_chain", lambda *args: None)
            want = slow._relay_through(root, tuple(receivers), nbytes)
            monkeypatch.undo()
            assert mine == want
            assert _state(fast) == _state(slow)
            fast.charge(root, mine[0], nbytes)
            slow.charge(root, want[0], nbytes)
    assert quick >= 30 and walked >= 3 and declined >= 5


@pytest.mark.parametrize("seed", range(3))
def test_relay_chain_answering_short_chains_first_is_the_memo_s_answer(seed, monkeypatch):
    """``relay_chain`` answers a short chain to other hosts that may not relay before
    asking its memo (:class:`balance.ChainMemo`); asked again and again (as a plan's
    pieces are), every answer and the loads left behind are the memo-and-walk path's
    (``remote_chain`` turned off)."""
    rng = random.Random(seed)
    cluster = CLUSTERS[0]
    answered = 0
    for trial in range(6):
        fast, slow = twin_loads(rng, cluster, crowded=trial % 2 == 1)
        asks = [(rng.randrange(len(cluster.devices)), tuple(sorted(set(
            _receivers(rng, cluster, 0)) - {0}))) for _ in range(6)]
        for _ in range(40):
            root, receivers = rng.choice(asks)
            receivers = tuple(d for d in receivers if d != root)
            if len(receivers) < 2:
                continue
            nbytes = rng.choice([500, 1 << 20])
            mine = fast.relay_chain(root, receivers, nbytes)
            monkeypatch.setattr(balance, "remote_chain", lambda *args: None)
            want = slow.relay_chain(root, receivers, nbytes)
            monkeypatch.undo()
            assert mine == want
            answered += not mine[1]
            fast.charge(root, mine[0], nbytes)
            slow.charge(root, want[0], nbytes)
            assert _state(fast) == _state(slow)
        assert len(fast._chains.chains) <= len(slow._chains.chains)
    assert answered >= 50
