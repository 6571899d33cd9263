"""The tiers, each with its own conftest.py and fixtures (docs/development.md, "Tests"):

- tests/unit: pure code and local tools (helm, promtool), no cluster; shares only tests/testkit.py.
- tests/cluster: the local control plane (tests/clusterkit.py's fixtures).
- tests/e2e: the control plane plus node agents running real training (clusterkit's fixtures too).
- tests/worker: torch and NVRx on this machine, no Kubernetes.

Helpers live in plain modules (testkit, clusterkit) that tests import by name; nothing is shared
through this file, so a unit run never imports cluster code.
"""
