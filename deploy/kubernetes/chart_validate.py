"""Check the chart and the plain manifests with real tools (see chart_tools.py), not by eye:

1. ``helm lint`` on the chart, with its default values and with every switch flipped (values-all-on.yaml);
2. ``helm template`` of both, plus manifests/xpu-runtime-kit.yaml: every built-in kind against Kubernetes' OpenAPI
   schemas of 1.36 and 1.37, and all but the DRA driver's objects also of 1.29 (kubernetes-validate --strict:
   unknown fields are errors, and so is a kind the version has no schema for), the ServiceMonitor and
   PrometheusRule against the Prometheus Operator's schemas (crd-validator/validate.mjs);
3. the PrometheusRule's groups with ``promtool check rules``;
4. the ConfigMap's healthd.toml with ``xpu-healthd --check-config`` and its plugin.toml with the plugin's parser.

    python3 deploy/kubernetes/chart_validate.py      # exit 0 when everything passes
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
if __package__ in (None, ""):
    sys.path.insert(0, str(HERE))

from chart_build import MANIFEST, render  # noqa: E402
from chart_tools import REPO, crd_validator, helm, kubernetes_validate, promtool  # noqa: E402

CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}
# Every built-in object against the versions the DRA driver is written for, and all but the DRA driver's objects
# (the daemon and the device plugin) also against the oldest version the chart supports (docs/kubernetes.md).
KUBERNETES_VERSIONS = ("1.36.0", "1.37.0")
OLDEST_VERSION = "1.29.0"
DRA_DRIVER_LABEL = ("app.kubernetes.io/name", "xpu-dra-driver")
NO_SCHEMA = "Couldn't find schema"  # kubernetes-validate only warns about a kind it has no schema for


def is_dra_driver_object(doc: dict[str, Any]) -> bool:
    key, value = DRA_DRIVER_LABEL
    return bool(doc["apiVersion"].startswith("resource.k8s.io/") or doc["metadata"].get("labels", {}).get(key) == value)


VARIANTS = {"defaults": [], "all switches flipped": ["-f", str(HERE / "values-all-on.yaml")]}


def documents(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def check_core(docs: list[dict[str, Any]], where: str, tmp: Path) -> list[str]:
    core = [d for d in docs if d["kind"] not in CRD_KINDS]
    errors = []
    for version in (*KUBERNETES_VERSIONS, OLDEST_VERSION):
        objects = core if version != OLDEST_VERSION else [d for d in core if not is_dra_driver_object(d)]
        path = tmp / f"{where.replace(' ', '-')}-core-{version}.yaml"
        path.write_text(yaml.safe_dump_all(objects))
        out = subprocess.run(
            [str(kubernetes_validate()), "--strict", "--quiet", "-k", version, str(path)],
            capture_output=True,
            text=True,
            check=False,
        )
        if out.returncode != 0 or NO_SCHEMA in out.stdout + out.stderr:
            errors.append(f"{where}: kubernetes-validate {version}: {(out.stdout + out.stderr).strip()}")
    return errors


def check_crds(docs: list[dict[str, Any]], where: str) -> list[str]:
    crds = [d for d in docs if d["kind"] in CRD_KINDS]
    if not crds:
        return []
    out = subprocess.run(
        ["node", str(crd_validator())],
        input="".join(json.dumps(d) + "\n" for d in crds),
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        return [f"{where}: Prometheus Operator schema: {(out.stdout + out.stderr).strip()}"]
    return []


def check_rules(docs: list[dict[str, Any]], where: str, tmp: Path) -> list[str]:
    errors = []
    for doc in (d for d in docs if d["kind"] == "PrometheusRule"):
        path = tmp / f"{where.replace(' ', '-')}-rules.yml"
        path.write_text(yaml.safe_dump({"groups": doc["spec"]["groups"]}))
        out = subprocess.run(
            [str(promtool()), "check", "rules", str(path)], capture_output=True, text=True, check=False
        )
        if out.returncode != 0:
            errors.append(f"{where}: promtool: {(out.stdout + out.stderr).strip()}")
    return errors


def check_configs(docs: list[dict[str, Any]], where: str, tmp: Path) -> list[str]:
    errors = []
    for doc in (d for d in docs if d["kind"] == "ConfigMap"):
        healthd = tmp / f"{where.replace(' ', '-')}-healthd.toml"
        healthd.write_text(doc["data"]["healthd.toml"])
        out = subprocess.run(
            [sys.executable, "-m", "healthd", "--check-config", "--config", str(healthd)],
            capture_output=True,
            text=True,
            cwd=REPO,
            check=False,
        )
        if out.returncode != 0:
            errors.append(f"{where}: healthd.toml: {(out.stdout + out.stderr).strip()}")
        plugin = tmp / f"{where.replace(' ', '-')}-plugin.toml"
        plugin.write_text(doc["data"]["plugin.toml"])
        code = (
            "import sys; from container.deviceplugin.config import build_parser, load; "
            "load(build_parser().parse_args(['--config', sys.argv[1]]))"
        )
        out = subprocess.run(
            [sys.executable, "-c", code, str(plugin)], capture_output=True, text=True, cwd=REPO, check=False
        )
        if out.returncode != 0:
            errors.append(f"{where}: plugin.toml: {(out.stdout + out.stderr).strip()}")
    return errors


def validate_rendered(text: str, where: str, tmp: Path) -> list[str]:
    docs = documents(text)
    kinds = sorted({d["kind"] for d in docs})
    print(f"{where}: {len(docs)} objects ({', '.join(kinds)})")
    return (
        check_core(docs, where, tmp)
        + check_crds(docs, where)
        + check_rules(docs, where, tmp)
        + check_configs(docs, where, tmp)
    )


def main() -> int:
    errors: list[str] = []
    with tempfile.TemporaryDirectory(prefix="xrk-validate-") as raw:
        tmp = Path(raw)
        for name, args in VARIANTS.items():
            lint = subprocess.run(
                [str(helm()), "lint", "--strict", str(HERE / "chart"), *args],
                capture_output=True,
                text=True,
                check=False,
            )
            if lint.returncode != 0:
                errors.append(f"helm lint ({name}): {(lint.stdout + lint.stderr).strip()}")
            errors += validate_rendered(render(args), f"chart, {name}", tmp)
        errors += validate_rendered(MANIFEST.read_text(), "manifests", tmp)
    for error in errors:
        print(f"FAIL {error}", file=sys.stderr)
    print("all valid" if not errors else f"{len(errors)} problem(s)")
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
