"""ckptstore's benchmarks: `python -m benchmarks.local`, `python -m benchmarks.object_store`,
`python -m benchmarks.scaling` (see docs/benchmarks.md)."""
