"""What every tier shares, and nothing that needs a cluster: the repository's paths, an RTJ body,
moto's fake AWS credentials, the one `wait_until`. Imports no cluster code (tests/unit imports it;
tests/unit/test_tiers.py checks that the unit tier stays free of the local control plane).
"""

from __future__ import annotations

import copy
import json
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from rtj_operator import api

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
TOOLS = ROOT / ".tools" / "bin"
RELEASE, RELEASE_NS = "rtj-operator", "rtj-system"


class Clock:
    """A hand-wound clock for code that takes `clock: Callable[[], float]`: calling it gives `now`, which a
    test sets or moves on."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def rtj_body(name: str = "train", namespace: str = "default", **spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"image": "worker:1", "nodes": {"count": 2},
                            "storage": {"storageClassName": "fsx-sc"}}
    base.update(spec)
    return {"apiVersion": api.API_VERSION, "kind": api.KIND,
            # The API server replaces uid and generation on create; builder tests read them.
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", "generation": 1},
            "spec": copy.deepcopy(base)}


def fake_aws_credentials(monkeypatch, region: str) -> None:
    """Credentials and region for moto's in-process AWS (no request leaves the machine)."""
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_SESSION_TOKEN": "testing", "AWS_DEFAULT_REGION": region}.items():
        monkeypatch.setenv(key, value)


def wait_until(check: Callable[[], Any], timeout: float = 30.0, what: str = "condition",
               interval: float = 0.1) -> Any:
    """Poll `check` until it returns something true (returned), or fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def load_yaml(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def rank_results(procs: list[subprocess.Popen[str]], timeout: float = 180) -> list[dict[str, Any]]:
    """What each rank process printed last as `RESULT <json>`, once all have exited 0 (killed past
    `timeout`); a rank that did not fails the test with its output."""
    try:
        outputs = [proc.communicate(timeout=timeout)[0] for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    results = []
    for rank, (proc, text) in enumerate(zip(procs, outputs, strict=True)):
        lines = [line for line in text.splitlines() if line.startswith("RESULT ")]
        assert proc.returncode == 0 and lines, f"rank {rank} exited {proc.returncode}:\n{text[-4000:]}"
        results.append(json.loads(lines[-1][len("RESULT "):]))
    return results


def free_port() -> int:
    """A loopback TCP port nobody listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


EC2_REGION = "us-west-2"


@pytest.fixture
def ec2(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """An EC2 client of moto's in-process AWS (import it into a test module to use it)."""
    import boto3
    from moto import mock_aws

    fake_aws_credentials(monkeypatch, EC2_REGION)
    with mock_aws():
        yield boto3.client("ec2", region_name=EC2_REGION)


def ec2_instance(ec2: Any) -> str:
    """A running p5.48xlarge instance in moto's EC2: its id."""
    image = ec2.describe_images()["Images"][0]["ImageId"]
    return ec2.run_instances(ImageId=image, MinCount=1, MaxCount=1, InstanceType="p5.48xlarge")["Instances"][0][
        "InstanceId"]
