#!/usr/bin/env python3
"""`helm install`, `helm upgrade` and `helm uninstall` with Helm v4's own library, for
tests/controller/clients.rs: the command lines people type, run by the Helm v4 Go SDK
inside PyPI's helm-python-sdk (import helm_python; no helm binary), against the cluster
of $KUBECONFIG, with Helm's default release storage (Secrets in the release namespace).

    helm_release.py install NAME CHART [-n NS] [--create-namespace] [--set K=V]...
    helm_release.py upgrade NAME CHART [-n NS] [--set K=V]...
    helm_release.py uninstall NAME [-n NS]
    helm_release.py status NAME [-n NS]

Prints the release as JSON (without its manifest) on success; Helm's message on standard
error and exit 1 on failure; exit 3 without the package.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

# The Helm SDK the tests expect (as tests/render_chart.py).
HELM_SDK = "v4.2.3"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["install", "upgrade", "uninstall", "status"])
    parser.add_argument("name")
    parser.add_argument("chart", nargs="?")
    parser.add_argument("-n", "--namespace", default="default")
    parser.add_argument("--create-namespace", action="store_true")
    parser.add_argument("--set", action="append", default=[])
    args = parser.parse_args()
    try:
        import helm_python as h
    except ImportError as e:
        print(f"cannot import helm_python ({e}): python3 -m pip install helm-python-sdk==0.2.2", file=sys.stderr)
        sys.exit(3)
    if h.helm_sdk_version() != HELM_SDK:
        print(f"helm_python links Helm SDK {h.helm_sdk_version()}, the tests expect {HELM_SDK}", file=sys.stderr)
        sys.exit(3)
    values: dict = {}
    for expression in args.set:
        merge(values, h.parse_set_string(expression))
    config = h.Config(kubeconfig_path=os.environ["KUBECONFIG"], namespace=args.namespace)
    try:
        if args.command == "install":
            release = config.install(
                args.chart, args.name, values,
                namespace=args.namespace, create_namespace=args.create_namespace,
            )
        elif args.command == "upgrade":
            release = config.upgrade(args.chart, args.name, values, namespace=args.namespace)
        elif args.command == "uninstall":
            release = config.uninstall(args.name)["release"]
        else:
            release = config.status(args.name)
    except h.HelmError as e:
        print(f"Error: {e}", file=sys.stderr)
        sys.exit(1)
    finally:
        config.close()
    release.pop("manifest", None)
    print(json.dumps(release, default=str))


def merge(into: dict, values: dict) -> None:
    for key, value in values.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            merge(into[key], value)
        else:
            into[key] = value


if __name__ == "__main__":
    main()
