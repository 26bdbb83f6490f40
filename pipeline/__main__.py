"""``python -m reshard.pipeline``: print :func:`reshard.pipeline.compare_schedules` tables.

Options: ``--stages``, ``--microbatches``, ``--forward``, ``--backward``,
``--transfer T [T ...]``, ``--schedules NAME [NAME ...]`` (see ``--help``).
"""

from reshard.pipeline.compare import main

main()
