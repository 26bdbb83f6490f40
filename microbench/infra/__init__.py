"""Test infrastructure that the library never imports: the emulated multi-host testbed
(network namespaces, :mod:`.testbed`), the Ray cluster on it (:mod:`.ray_cluster`) and
exit guards (:mod:`.exit_guard`). Benchmarks and tests build them and hand the library
a placement (``Runtime(..., netns=testbed)``); see docs/architecture.md."""
