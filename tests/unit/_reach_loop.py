"""The model's reach of a broadcast tree edge by edge, as a loop: the oracle that
test_tree_reach and test_route_arrays hold the array forms to."""


def reach_loop(a, b, wait, fill):
    """The latest reach of the tree of edges ``a[i] -> b[i]`` in order, each edge
    waiting ``wait[i]`` and, where its sender was reached by an earlier edge,
    ``fill[i]`` more (``fill`` None: none); the model's definition."""
    reach: dict[int, float] = {}
    got: set[int] = set()
    for i, (s, r, w) in enumerate(zip(a, b, wait)):
        at = reach.get(s, 0.0) + w
        if fill is not None and s in got:
            at += fill[i]
        if at > reach.get(r, 0.0):
            reach[r] = at
        else:
            reach.setdefault(r, 0.0)
        got.add(r)
    return max(reach.values())
