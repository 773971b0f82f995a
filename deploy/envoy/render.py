"""Render deploy/envoy/envoy.yaml for other places than Kubernetes.

  python deploy/envoy/render.py local --upstream 127.0.0.1:50061 --upstream 127.0.0.1:50062 \\
      --listen 127.0.0.1:8080 -o envoy.json
      the same routing, affinity, health checks, outlier ejection and retries, with the
      replicas at fixed addresses instead of the Kubernetes Service's DNS name (what the
      loopback test in tests/integration/test_envoy.py runs). Then: envoy -c envoy.json

  python deploy/envoy/render.py configmap -o deploy/k8s/envoy-config.yaml
      the Kubernetes ConfigMap that carries envoy.yaml; `--check` fails if the file on
      disk differs (make lint).

envoy.yaml stays the one source of truth: `local` changes only addresses and, when
asked, the health-check pace.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "envoy.yaml"
CONFIGMAP = HERE.parent / "k8s" / "envoy-config.yaml"
CLUSTER = "nib"


def host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"{text!r}: expected HOST:PORT")
    return host, int(port)


def _socket(host: str, port: int) -> dict[str, Any]:
    return {"socket_address": {"address": host, "port_value": port}}


def _named(items: list[dict[str, Any]], name: str) -> dict[str, Any]:
    for item in items:
        if item.get("name") == name:
            return item
    raise KeyError(f"{SOURCE.name} has nothing named {name!r}")


def local(
    config: dict[str, Any],
    upstreams: list[tuple[str, int]],
    listen: tuple[str, int],
    admin: tuple[str, int],
    ops: tuple[str, int] | None,
    health_interval_s: float | None,
) -> dict[str, Any]:
    """The config with static replica addresses, listeners moved, and optionally a faster
    health-check pace (tests)."""
    if not upstreams:
        raise ValueError("give at least one --upstream")
    res = config["static_resources"]
    config["admin"]["address"] = _socket(*admin)
    _named(res["listeners"], "nib_grpc")["address"] = _socket(*listen)
    if ops is None:
        res["listeners"] = [x for x in res["listeners"] if x["name"] != "ops"]
        res["clusters"] = [c for c in res["clusters"] if c["name"] != "envoy_admin"]
    else:
        _named(res["listeners"], "ops")["address"] = _socket(*ops)
        admin_cluster = _named(res["clusters"], "envoy_admin")
        admin_cluster["load_assignment"]["endpoints"] = [
            {"lb_endpoints": [{"endpoint": {"address": _socket(*admin)}}]}
        ]
    cluster = _named(res["clusters"], CLUSTER)
    cluster.pop("cluster_type", None)
    cluster["type"] = "STATIC"
    cluster["load_assignment"]["endpoints"] = [
        {"lb_endpoints": [{"endpoint": {"address": _socket(h, p)}} for h, p in upstreams]}
    ]
    if health_interval_s is not None:
        seconds = f"{health_interval_s:g}s"
        for check in cluster["health_checks"]:
            check["interval"] = check["no_traffic_interval"] = seconds
            check["interval_jitter"] = "0s"
            check["timeout"] = f"{max(health_interval_s, 0.5):g}s"
    return config


def configmap(source_text: str) -> str:
    body = "".join(f"    {line}\n" if line.strip() else "\n" for line in source_text.splitlines())
    return (
        "# Generated from deploy/envoy/envoy.yaml by"
        " `python deploy/envoy/render.py configmap -o deploy/k8s/envoy-config.yaml`.\n"
        "# Edit envoy.yaml, not this file (make lint checks that they agree).\n"
        "apiVersion: v1\n"
        "kind: ConfigMap\n"
        "metadata:\n"
        "  name: nib-envoy\n"
        "  labels:\n"
        "    app.kubernetes.io/name: nib-envoy\n"
        "    app.kubernetes.io/part-of: nib\n"
        "data:\n"
        "  envoy.yaml: |\n" + body
    )


def _write(text: str, out: Path | None) -> None:
    if out is None:
        sys.stdout.write(text)
    else:
        out.write_text(text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    loc = sub.add_parser("local", help="static replica addresses (JSON, which Envoy reads)")
    loc.add_argument("--upstream", type=host_port, action="append", default=[], required=True)
    loc.add_argument("--listen", type=host_port, default=("127.0.0.1", 50050))
    loc.add_argument("--admin", type=host_port, default=("127.0.0.1", 9901))
    loc.add_argument("--ops", type=host_port, help="the /healthz + metrics listener (off)")
    loc.add_argument("--health-interval", type=float, help="seconds between health checks")
    loc.add_argument("-o", "--out", type=Path)
    cm = sub.add_parser("configmap", help="the Kubernetes ConfigMap holding envoy.yaml")
    cm.add_argument("-o", "--out", type=Path)
    cm.add_argument("--check", action="store_true", help="fail if --out (default ours) differs")
    args = p.parse_args(argv)
    source_text = SOURCE.read_text()
    if args.command == "local":
        config = local(
            yaml.safe_load(source_text),
            args.upstream,
            args.listen,
            args.admin,
            args.ops,
            args.health_interval,
        )
        _write(json.dumps(config, indent=1) + "\n", args.out)
        return 0
    text = configmap(source_text)
    if args.check:
        target = args.out or CONFIGMAP
        if not target.is_file() or target.read_text() != text:
            print(
                f"{target} is out of date with {SOURCE}: run"
                f" python deploy/envoy/render.py configmap -o {target}",
                file=sys.stderr,
            )
            return 1
        return 0
    _write(text, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
