"""`nib health --verbose`: the server's GetHealthDetail, formatted for a person."""

from __future__ import annotations

import grpc

from nib.sdk.errors import from_rpc_error
from nib.v1 import completion_pb2 as pb
from nib.v1 import completion_pb2_grpc as pb_grpc


def fetch_health_detail(address: str, timeout: float) -> pb.GetHealthDetailResponse:
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.CompletionServiceStub(channel)
        try:
            response: pb.GetHealthDetailResponse = stub.GetHealthDetail(
                pb.GetHealthDetailRequest(), timeout=timeout
            )
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None
    return response


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _rate(n: float) -> str:
    for unit in ("B/s", "kB/s", "MB/s", "GB/s"):
        if abs(n) < 1000 or unit == "GB/s":
            return f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB/s"


def _name(value: int, enum: str, prefix: str) -> str:
    return pb.DESCRIPTOR.enum_types_by_name[enum].values_by_number[value].name.removeprefix(prefix)


def _versions(v: pb.Versions) -> list[str]:
    lines = [f"nib {v.nib} · python {v.python} · torch {v.torch}"]
    if v.cuda_runtime:
        lines[0] += f" (CUDA {v.cuda_runtime})"
    if v.triton:
        lines[0] += f" · triton {v.triton}"
    if v.gpu:
        driver = v.nvidia_driver or "unknown"
        lines.append(
            f"{v.gpu} · compute capability {v.compute_capability} "
            f"(kernels need >= {v.min_compute_capability}) · driver {driver} "
            f"(CUDA {v.cuda_driver or 'unknown'})"
        )
        lines.append(f"kernels {v.kernels_build}")
    return lines


def _gpu(g: pb.GpuState) -> list[str]:
    parts = []
    if g.HasField("temperature_celsius"):
        parts.append(f"{g.temperature_celsius:.0f} °C")
    if g.HasField("power_watts"):
        limit = f"/{g.power_limit_watts:.0f}" if g.HasField("power_limit_watts") else ""
        parts.append(f"{g.power_watts:.0f}{limit} W")
    if g.HasField("sm_clock_mhz"):
        top = f" (max {g.sm_clock_max_mhz:.0f})" if g.HasField("sm_clock_max_mhz") else ""
        parts.append(f"SM {g.sm_clock_mhz:.0f} MHz{top}")
    if g.HasField("memory_clock_mhz"):
        parts.append(f"memory {g.memory_clock_mhz:.0f} MHz")
    if g.HasField("utilization"):
        parts.append(f"busy {g.utilization:.0%}")
    lines = [" · ".join(parts) + f"  (sampled {g.age_seconds:.1f}s ago)"]
    reasons = [r for r in g.throttle_reasons if r != "gpu_idle"]
    idle = " (idle)" if "gpu_idle" in g.throttle_reasons else ""
    lines.append(f"throttling: {', '.join(reasons) if reasons else 'none'}{idle}")
    if g.HasField("pcie_rx_bytes_per_second"):
        link = ""
        if g.HasField("pcie_generation"):
            link = f"PCIe gen{g.pcie_generation} x{g.pcie_width}"
            if g.HasField("pcie_max_generation"):
                link += f" (max gen{g.pcie_max_generation} x{g.pcie_max_width}"
                if g.HasField("pcie_link_bytes_per_second"):
                    link += f", {_rate(g.pcie_link_bytes_per_second)} per direction"
                link += ")"
            link += " · "
        lines.append(
            f"{link}rx {_rate(g.pcie_rx_bytes_per_second)} · tx {_rate(g.pcie_tx_bytes_per_second)}"
        )
    if g.HasField("memory_used_bytes"):
        lines.append(
            f"device memory {_bytes(g.memory_used_bytes)} used of {_bytes(g.memory_total_bytes)}"
        )
    return lines


def _memory(m: pb.MemoryHealth) -> str:
    text = f"allocated {_bytes(m.allocated_bytes)} · reserved {_bytes(m.reserved_bytes)}"
    if m.graph_pool_method:
        text += f" · graph pool {_bytes(m.graph_pool_bytes)} ({m.graph_pool_method})"
    if m.HasField("fragmentation"):
        high = "  HIGH" if m.fragmentation > m.fragmentation_threshold else ""
        text += (
            f" · fragmentation {m.fragmentation:.1%} (warns above "
            f"{m.fragmentation_threshold:.0%}){high}"
        )
    return text


def _table(rows: list[list[str]], indent: str = "  ") -> list[str]:
    if not rows:
        return []
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return [
        indent + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[-1]
        for r in rows
    ]


def format_health_detail(d: pb.GetHealthDetailResponse) -> str:
    label = 12
    out: list[str] = []

    def add(title: str, lines: list[str] | str) -> None:
        lines = [lines] if isinstance(lines, str) else lines
        for i, line in enumerate(lines or [""]):
            out.append((title if i == 0 else "").ljust(label) + line)

    state = _name(d.state, "ServerState", "SERVER_STATE_").lower()
    add("state", f"{state} · kernels: {d.kernel_mode}")
    if d.error:
        add("error", d.error)
    add("model", f"{d.model} on {d.device} · nib server {d.server_version}")
    add("versions", _versions(d.versions))
    if d.HasField("gpu"):
        add("gpu", _gpu(d.gpu))
    else:
        add("gpu", d.telemetry_note or "no GPU telemetry")
    if d.HasField("memory"):
        add("memory", _memory(d.memory))
    check = d.self_check
    status = _name(check.status, "SelfCheckStatus", "SELF_CHECK_STATUS_").lower().replace("_", " ")
    add("self-check", f"{status}: {check.note}" if check.note else status)
    out += _table(
        [
            [
                "ok" if c.passed else "FAIL",
                c.kernel,
                c.shape,
                c.path,
                f"error {c.error:.1e} <= {c.tolerance:.0e}" if c.passed else c.message,
            ]
            for c in check.checks
        ]
    )
    add("kernels", "" if d.kernel_paths else "none reported yet")
    out += _table(
        [
            [
                p.layer,
                p.op,
                f"rows {p.rows}",
                p.kernel + ("  FALLBACK" if p.fallback else ""),
                f"[{p.graphs}]" if p.graphs else "",
            ]
            for p in d.kernel_paths
        ]
    )
    fallen = {k: v for k, v in d.kernel_fallbacks.items() if v}
    if d.kernel_fallbacks:
        add(
            "fallbacks",
            ", ".join(f"{k} {v}" for k, v in sorted(fallen.items())) if fallen else "none",
        )
    ready = sum(g.ready for g in d.graphs)
    add("graphs", f"{ready}/{len(d.graphs)} captured" if d.graphs else "none (no CUDA graphs)")
    out += _table(
        [
            [
                "ready" if g.ready else "EAGER" if g.fallback else "pending",
                g.name,
                f"{g.capture_ms:.1f} ms" if g.capture_ms else "",
                (f"ran eagerly {g.eager_runs}x " if g.eager_runs else "") + g.error,
            ]
            for g in d.graphs
        ]
    )
    return "\n".join(line.rstrip() for line in out)
