"""Fake ``cupy.cuda.runtime``."""


def getDeviceCount() -> int:  # noqa: N802 - cupy's name
    return 1
