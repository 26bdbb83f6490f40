"""A synthetic stage for timing pipelines: fixed forward / backward times, real tensors.

:class:`TimedStage` sleeps for its compute time (as the host thread of a GPU stage waits
for its kernels: the CPU stays free for the transfer threads) and passes its input on,
so activations and gradients of a chosen size really cross the meshes. Used by
``python -m reshard.microbench.pipeline_bench`` to compare schedules with real
transfers against the simulator.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np


class TimedStage:
    """Identity stage that takes ``forward_s`` / ``backward_s`` seconds.

    Args:
        forward_s: seconds of a forward.
        backward_s: seconds of a full backward (split evenly into I and W).
    """

    def __init__(self, forward_s: float, backward_s: float) -> None:
        self.forward_s = forward_s
        self.backward_s = backward_s

    def forward(self, params: Mapping[str, np.ndarray], x: np.ndarray) -> tuple[np.ndarray, Any]:
        """Sleep, return the input."""
        time.sleep(self.forward_s)
        return x, None

    def backward_input(self, params: Mapping[str, np.ndarray], saved: Any,
                       dy: np.ndarray) -> tuple[np.ndarray, Any]:
        """Sleep half the backward time, return the gradient."""
        time.sleep(self.backward_s / 2)
        return dy, None

    def backward_weight(self, params: Mapping[str, np.ndarray], saved: Any) -> dict[str, np.ndarray]:
        """Sleep the other half; no parameters."""
        time.sleep(self.backward_s / 2)
        return {}

    def loss(self, y: np.ndarray, target: np.ndarray) -> tuple[float, np.ndarray]:
        """Zero loss, a gradient of ones."""
        return 0.0, np.ones_like(y)
