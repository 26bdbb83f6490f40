"""The meshes of the search tests' 4x8 requests, named by how they sit on a cluster."""
from reshard import Cluster, DeviceMesh


def meshes(how: str) -> tuple[DeviceMesh, DeviceMesh, Cluster, str]:
    """Source mesh, destination mesh, cluster and dtype: 4x8 on dgx-h100 (``cross``: mesh
    to mesh, the cold set's; ``same``: within one mesh; ``overlap``: a mesh shifted by one
    host; ``spread``: a source whose rows span two hosts each), or 4x4 on
    aws-p3.8xlarge (``p3``)."""
    if how == "p3":
        a = DeviceMesh((4, 4), range(16))
        return a, a, Cluster.preset("aws-p3.8xlarge", 4), "float32"
    if how == "spread":
        order = [d for h in range(4) for d in (*range(8 * h, 8 * h + 4),
                                               *range(8 * h + 36, 8 * h + 40))]
        return (DeviceMesh((4, 8), order), DeviceMesh((4, 8), range(32, 64)),
                Cluster.preset("dgx-h100", 8), "bfloat16")
    start = {"cross": 32, "same": 0, "overlap": 8}[how]
    return (DeviceMesh((4, 8), range(32)), DeviceMesh((4, 8), range(start, start + 32)),
            Cluster.preset("dgx-h100", 4 + start // 8), "bfloat16")
