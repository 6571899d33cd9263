"""The unit tier's fixtures: no cluster, no node agents, no training (tests/testkit.py's shared ones)."""

from collections.abc import Iterator

import pytest

from rtj_operator import memo
from testkit import ec2  # noqa: F401


@pytest.fixture(autouse=True)
def _fresh_memo() -> Iterator[None]:
    """Each test starts with nothing worked out (memo.py): hand-built objects reuse uids and
    resourceVersions across tests with other contents, which the stores never do."""
    memo.reset()
    yield
