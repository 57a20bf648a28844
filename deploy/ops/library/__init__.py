"""The ops deploy ships, one file each, plus `pooling.py` (the pooling ops' windows, computations
and reference) and `argmax_compute.py` (argmax's reducer and the forms targets compute it in);
`deploy.ops.registry.load_builtin` imports every module here. The framework they are written
against is `deploy.ops`, which user op files import too."""
