"""How ranks find and trust each other before any plan runs: the rendezvous (a
key-value store over TCP, ``rendezvous.py``, or over a store the host already has,
``store_rendezvous.py``), the sockets every CPU plane listens and connects with
(``sockets.py``: bound to loopback or a configured interface, never the wildcard) and
the run's link key that authenticates connections (``link_key.py``).
"""
