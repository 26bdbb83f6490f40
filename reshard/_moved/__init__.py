"""Modules that answer the package's old import paths: ``reshard`` lists this folder in its
``__path__``, so ``import reshard.errors`` finds ``errors.py`` here, which makes the old
name the very module of ``reshard/core/`` (no warning: the short paths of the core layer
stay). Nothing imports from here by this package's name."""
