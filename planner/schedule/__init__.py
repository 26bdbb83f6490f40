"""Tasks in the order every worker follows: the global order and its steps
(``order``), a large plan's sends kept as columns until that order is known
(``work``, ``send_columns``), staging memory and byte budgets (``staging``), and
messages coalesced per peer (``coalesce``)."""
