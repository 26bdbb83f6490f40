"""GPU kernels of the core layer: the fused casts (:mod:`reshard.core.kernels.cast_source`, the
CUDA source; :mod:`reshard.core.kernels.cast_geometry`, where they read and write;
:mod:`reshard.core.kernels.cast_launch`, launching them on cupy arrays and torch CUDA
tensors). Nothing here imports cupy or torch until a kernel runs."""
