"""deploy: one namespace, so nothing else installed named `ops` or `base` shadows ours. The pipeline:
`ops` (what an op is; `ops/library` the shipped ones) -> `schedules` -> `compiler` (modules, bundles)
-> `devices` -> `verify`; `tune`, `bench`, `model` and the `cli` on top; `base` beneath all."""
