"""What a plan costs and whether it is right: the cost model's fluid simulation and the
lower bound (``cost``), max-min fair shares (``fairshare``), the step rule
(``stepgate``), and the verifier (``verify``, with the box geometry it asks,
``coverage``)."""
