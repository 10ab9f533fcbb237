"""The summary of a real-GPU validation run (bench/device_check.py): its results JSON as a few lines for a person."""

from __future__ import annotations

from typing import Any


def summary(results: dict[str, Any]) -> str:
    lines = [f"xpu-runtime-kit device check, {results['when']}, {results.get('gpu', '?')}"]
    c = results.get("contract_rc")
    lines.append(f"contract tests on real NVML: {'not run' if c is None else 'PASS' if c == 0 else f'FAIL (rc {c})'}")
    lines.append(f"card settings unchanged: {results.get('settings_unchanged')}")
    d = results["steps"].get("daemon", {})
    if "error" in d:
        lines.append(f"daemon minute: ERROR {d['error']}")
    elif d:
        lines.append(
            f"daemon minute ({d['gpus']} GPU): {'OK' if d['ok'] else 'PROBLEMS ' + '; '.join(d['problems'])}; "
            f"CPU {d['cpu_share_percent']:.2f}% of a core, RSS {d['rss_mib']:.1f} MiB, "
            f"/metrics p50 {d['scrape_p50_ms']:.1f} ms p99 {d['scrape_p99_ms']:.1f} ms, call errors {d['call_errors']}"
        )
    o = results["steps"].get("overhead", {})
    if "error" in o:
        lines.append(f"NVML overhead: ERROR {o['error']}")
    elif o:
        lines += [
            f"NVML overhead GPU {g['gpu']}: backend {g['backend_wall_ms']:.3f} ms vs raw {g['raw_wall_ms']:.3f} ms "
            f"({g['overhead_ratio']:.2f}x, {g['nvml_calls']} calls)"
            for g in o["gpus"]
        ]
        s = o["sampler"]
        lines.append(
            f"sampler cycle {s['cycle_wall_ms']:.3f} ms vs raw serial {s['raw_serial_wall_ms']:.3f} ms "
            f"({s['overhead_ratio_wall']:.2f}x)"
        )
    t = results["steps"].get("throughput", {})
    if "error" in t:
        lines.append(f"throughput: ERROR {t['error']}")
    elif t:
        lines.append(f"{'bf16 matmul 8192':<24} {'TFLOP/s':>8} {'vs alone':>9} {'daemon CPU':>11} {'util seen':>10}")
        for phase, r in t.items():
            cpu = f"{r['daemon_cpu_share_percent']:.2f}%" if "daemon_cpu_share_percent" in r else "-"
            util = f"{r['utilization_max']:.2f}" if "utilization_max" in r else "-"
            lines.append(f"{phase:<24} {r['tflops']:>8.1f} {r['vs_alone']:>9.3f} {cpu:>11} {util:>10}")
    p = results["steps"].get("peers", {})
    if "error" in p:
        lines.append(f"peers: ERROR {p['error']}")
    elif p:
        lines.append(f"{'same card, 1 s interval':<24} {'p50 ms':>8} {'p99 ms':>8} {'CPU/sample':>11} {'RSS MiB':>8}")
        for name, r in p.items():
            if "error" in r:
                lines.append(f"{name:<24} ERROR {r['error']}")
                continue
            lines.append(
                f"{name:<24} {r['scrape_p50_ms']:>8.2f} {r['scrape_p99_ms']:>8.2f} "
                f"{r['cpu_per_sample_ms']:>8.2f} ms {r['rss_mib']:>8.1f}"
            )
    return "\n".join(lines)


__all__ = ["summary"]
