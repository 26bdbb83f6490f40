"""What a plan costs and whether it is right: the cost model's routes and the lower
bound (``cost``), its fluid simulation (``fluid``), max-min fair shares
(``fairshare``), the step rule (``stepgate``), and the verifier (``verify``, with the
box geometry it asks, ``coverage``)."""
