"""Generated stubs of the ``reshard.v1`` protocol (``reshard.proto``); regenerate with
``python -m reshard.service.regen``."""
