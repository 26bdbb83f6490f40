"""One-release aliases of test infrastructure that moved (issue 65): ``reshard.microbench.infra``
lists this folder in its ``__path__``, so ``reshard.microbench.infra.testbed`` still imports
(and runs as ``python -m``), with a DeprecationWarning. Nothing imports from here by this
package's name."""
