"""Development tooling for rtj-operator: a local control plane from upstream binaries, kwok nodes,
and helpers for tests, the demo and the benchmarks. Not part of the operator or worker packages."""
