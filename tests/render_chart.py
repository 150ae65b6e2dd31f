#!/usr/bin/env python3
"""Renders and lints charts/mailer-operator with Helm's own engine, for tests/chart.rs.

Helm's engine here is the Helm v4 Go SDK (helm.sh/helm/v4) compiled into the native
library that the PyPI package helm-python-sdk ships (import name helm_python); no helm
binary is needed. The rendering is `helm template`'s: an install with a client-side
dry run into memory storage, which coalesces the values with the chart's defaults,
validates them against values.schema.json and renders every template.

    render_chart.py template [--release R] [--namespace N] [--values FILE|-]
                             [--kube-version 1.28.0|newest]... [--allow-unvalidated KIND]...
        The manifests as `helm template` prints them. With --kube-version, every
        object is also validated (strictly: no unknown fields) against the Kubernetes
        OpenAPI schemas of that version that the PyPI package kubernetes-validate ships
        (`newest`: the newest it ships); a kind it has no schema for fails unless named
        with --allow-unvalidated.
    render_chart.py deploy
        deploy/operator.yaml: the chart's defaults as release mailer-operator in the
        namespace mailer-system, after that Namespace; `make manifests` writes it.
    render_chart.py notes [--release R] [--namespace N] [--values FILE|-]
        The rendered NOTES.txt.
    render_chart.py lint [--values FILE|-]
        `helm lint --strict`: any error or warning fails.
    render_chart.py crds
        The CRD files Helm loads from the chart's crds/ folder, as loaded.

Values come from a YAML (or JSON) file, `-` for standard input; the chart's
values.yaml supplies the rest, as with `helm template -f FILE`. A failure prints
Helm's message on standard error and exits 1; a missing package exits 3.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

CHART = Path(__file__).resolve().parent.parent / "charts" / "mailer-operator"
# The Helm SDK whose engine the test relies on; another one must be looked at first.
HELM_SDK = "v4.2.3"


def fail(message: str, code: int = 1) -> None:
    print(message, file=sys.stderr)
    sys.exit(code)


def helm():
    try:
        import helm_python
    except ImportError as e:  # pragma: no cover - depends on the machine
        fail(
            f"cannot import helm_python ({e}): python3 -m pip install helm-python-sdk==0.2.2",
            3,
        )
    version = helm_python.helm_sdk_version()
    if version != HELM_SDK:
        fail(f"helm_python links Helm SDK {version}, the tests expect {HELM_SDK}", 3)
    return helm_python


def read_values(h, source: str | None) -> dict:
    if source is None:
        return {}
    text = sys.stdin.read() if source == "-" else Path(source).read_text()
    return h.values_from_yaml(text) or {}


def install_dry_run(h, args) -> dict:
    """`helm template`: an install dry-run on the client, stored in memory only."""
    values = read_values(h, args.values)
    with h.Chart.load(CHART) as chart:
        config = h.Config(storage_driver="memory", namespace=args.namespace)
        try:
            return config.install(
                chart,
                args.release,
                values,
                namespace=args.namespace,
                dry_run="client",
            )
        except h.HelmError as e:
            fail(f"helm template failed: {e}")
        finally:
            config.close()


def kube_validate(manifest: str, version: str, allowed: set[str]) -> None:
    try:
        import kubernetes_validate
        import kubernetes_validate.utils
        import yaml
    except ImportError as e:  # pragma: no cover - depends on the machine
        fail(f"cannot import {e.name}: python3 -m pip install kubernetes-validate==1.37.0", 3)
    if version == "newest":
        version = kubernetes_validate.utils.latest_version()
    problems = []
    for document in yaml.safe_load_all(manifest):
        if document is None:
            continue
        name = f"{document.get('kind')} {document.get('metadata', {}).get('name')}"
        if document.get("kind") in allowed:
            print(f"not validated (no schema): {name}", file=sys.stderr)
            continue
        try:
            kubernetes_validate.validate(document, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            problems.append(
                f"{name}: {e.message} at {'.'.join(map(str, e.path))} (Kubernetes {version})"
            )
        except kubernetes_validate.SchemaNotFoundError as e:
            problems.append(
                f"{name}: kubernetes-validate has no schema for {document.get('apiVersion')}"
            )
        except kubernetes_validate.InvalidSchemaError as e:
            problems.append(f"{name}: {e}")
    if problems:
        fail("Kubernetes schema validation failed:\n  " + "\n  ".join(problems))


DEPLOY_HEADER = """\
# Generated from charts/mailer-operator by `make manifests`: do not edit (a test fails
# when this file and the chart's render differ; change the chart instead).
#
# The mailer operator without Helm, with the chart's defaults: two replicas electing a
# leader through the Lease mailer-operator in mailer-system, watching all namespaces,
# running ghcr.io/mailer-operator/mailer (the workers too).
#   kubectl apply --server-side -f crds/mailerpipeline.yaml
#   kubectl apply -f deploy/operator.yaml
# To change a setting, render the chart with your values instead:
#   helm template mailer-operator charts/mailer-operator -n mailer-system -f my-values.yaml
---
apiVersion: v1
kind: Namespace
metadata:
  name: {namespace}
  labels:
    # The operator's pods meet the "restricted" Pod Security Standard.
    pod-security.kubernetes.io/enforce: restricted
"""


def deploy_manifest(h) -> str:
    """deploy/operator.yaml: a Namespace, and the chart's defaults rendered into it."""
    args = argparse.Namespace(values=None, release="mailer-operator", namespace="mailer-system")
    manifest = install_dry_run(h, args).get("manifest") or ""
    return DEPLOY_HEADER.format(namespace=args.namespace) + manifest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("template", "notes"):
        command = commands.add_parser(name)
        command.add_argument("--release", default="mailer")
        command.add_argument("--namespace", default="mailer-system")
        command.add_argument("--values")
        if name == "template":
            command.add_argument("--kube-version", action="append", default=[])
            command.add_argument("--allow-unvalidated", action="append", default=[])
    lint = commands.add_parser("lint")
    lint.add_argument("--values")
    lint.add_argument("--namespace", default="mailer-system")
    commands.add_parser("crds")
    commands.add_parser("deploy")
    args = parser.parse_args()

    h = helm()
    if args.command == "template":
        release = install_dry_run(h, args)
        manifest = release.get("manifest") or ""
        for version in args.kube_version:
            kube_validate(manifest, version, set(args.allow_unvalidated))
        sys.stdout.write(manifest)
    elif args.command == "deploy":
        sys.stdout.write(deploy_manifest(h))
    elif args.command == "notes":
        sys.stdout.write(install_dry_run(h, args).get("notes") or "")
    elif args.command == "lint":
        values = read_values(h, args.values)
        report = h.lint(CHART, values, strict=True, namespace=args.namespace)
        # Severity: 1 info, 2 warning, 3 error; strict fails on warnings too.
        bad = [m for m in report["messages"] if m["severity"] >= 2]
        for message in report["messages"]:
            level = {1: "INFO", 2: "WARNING", 3: "ERROR"}.get(message["severity"], "?")
            print(f"[{level}] {message['path']}: {message['error']}", file=sys.stderr)
        if bad or report.get("errors"):
            fail("helm lint --strict failed: " + "; ".join(report.get("errors") or []))
        print(f"linted {report['total_charts_linted']} chart, no warnings")
    elif args.command == "crds":
        with h.Chart.load(CHART) as chart:
            crds = chart.crds
        if not crds:
            fail("Helm loaded no CRD from the chart's crds/ folder")
        for crd in crds:
            sys.stdout.write(f"# {crd['filename']}\n")
            sys.stdout.write(crd["data"])


if __name__ == "__main__":
    os.environ.setdefault("HELM_DRIVER", "memory")
    main()
