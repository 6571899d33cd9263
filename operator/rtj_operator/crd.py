"""`python -m rtj_operator.crd`: print the CRD generated from api.py (see `make crds`)."""

from __future__ import annotations

import yaml

from .api import crd_manifest

HEADER = "# Generated from operator/rtj_operator/api.py by `make crds`. Do not edit.\n"


def render() -> str:
    return HEADER + yaml.safe_dump(crd_manifest(), sort_keys=False, width=120)


if __name__ == "__main__":
    print(render(), end="")
