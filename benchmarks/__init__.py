"""ckptstore's benchmarks: `python -m benchmarks.limits`, `benchmarks.local`,
`benchmarks.blob_count`, `benchmarks.training_loop`, `benchmarks.object_store`,
`benchmarks.scaling` (see docs/benchmarks.md)."""
