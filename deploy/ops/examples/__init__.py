"""Example user ops: not built in; load them with `deploy --ops-path deploy/ops/examples`."""
