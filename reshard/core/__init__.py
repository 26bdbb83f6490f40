"""The core layer: values and rules every other layer shares.

Meshes (``mesh``), sharding specs (``spec``), layouts (``layout``), clusters
(``cluster``, ids placed once each: ``unique_ids``) and the machine types they are built
from (``presets``, the figures in ``presets.toml``); the dtype policy (``dtypes``), the
bits of dtypes a library lacks (``bits``) and the cast kernels (``casting``; on a GPU
the fused kernels of ``kernels/``); packed parameters' views (``packed``), arrays alive
on workers (``darray``), the error classes (``errors``), enum choices parsed once
(``choice``), text tables (``tables``), command-line value types (``cliargs``),
``--help`` text for a terminal (``helptext``), packages' lazily imported names
(``lazy``), a bounded cache (``lru``), the collector paused while a plan is built
(``gcpause``) and the version (``version``).

Nothing here imports a higher layer. Each module also imports by its short path
(``reshard.core.errors`` is ``reshard.core.errors``, the same module object).
"""
