"""reshard's version (``setup.py`` says the same; ``tests/unit/test_layers.py`` checks it), in a module of its own so that any layer can read it without importing the package's facade."""

__version__ = "0.1.0"
