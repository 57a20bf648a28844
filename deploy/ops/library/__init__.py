"""The ops deploy ships, one file each, plus `pooling.py` (the pooling ops' windows and reference);
`deploy.ops.registry.load_builtin` imports every module here. The framework they are written
against is `deploy.ops`, which user op files import too."""
