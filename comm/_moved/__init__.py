"""One-release aliases of the data plane's modules that moved into ``engine/`` and
``bootstrap/`` (issue 65): ``reshard.comm`` lists this folder in its ``__path__``, so
``reshard.comm.execution`` still imports (with a DeprecationWarning) and gives the moved
module's objects. Nothing imports from here by this package's name."""
