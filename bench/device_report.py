"""The device check's summary: summary.json (every step's outcome and figures) and summary.txt (a few lines a person
reads first, also printed as the command's last lines). Standard library only, and every figure line is built
defensively: a step whose JSON is missing or has another shape shows its last log line instead.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from bench.check_runner import Outcome

FIGURES_MAX_CHARS = 20_000  # a step's JSON larger than this stays in the tarball only
PYTEST_RESULT = re.compile(r"\b\d+ (passed|failed|skipped|errors?)\b.*")


def _f(value: Any, digits: int = 1) -> str:
    return "n/a" if not isinstance(value, int | float) else f"{value:.{digits}f}"


def _setup(r: Mapping[str, Any]) -> str:
    w = r.get("wheels", {})
    parts = [f"wheels {len(w.get('installed', []))} installed, {len(w.get('kept', []))} kept from the machine"]
    if w.get("error"):
        parts.append(f"wheel install FAILED: {w['error']}")
    gpus = r.get("gpus")
    parts.append(f"{len(gpus)} GPU: {gpus[0]}" if isinstance(gpus, list) and gpus else f"GPUs: {gpus}")
    d = r.get("deviceallow", {})
    parts.append(f"DeviceAllow {'lets every node through' if d.get('rc') == 0 else 'DENIES ' + str(d.get('denied'))}")
    return "; ".join(parts)


def _daemon(r: Mapping[str, Any]) -> str:
    api = r.get("api", {})
    calls = ", ".join(f"{k} {v.get('ms', 0):.0f} ms" if v.get("ok") else f"{k} FAILED" for k, v in api.items())
    problems = r.get("problems")
    return (
        f"{r.get('gpus')} GPU, backend {r.get('backend')}, {r.get('scrapes')} scrapes, "
        f"problems: {'; '.join(problems) if problems else 'none'}; CPU {_f(r.get('cpu_share_percent'), 2)}% of a "
        f"core, RSS {_f(r.get('rss_mib'))} MiB, /metrics p50 {_f(r.get('scrape_p50_ms'))} ms; API: {calls or '-'}"
    )


def _gpm(r: Mapping[str, Any]) -> str:
    cards = []
    for gpu, card in sorted(r.items()):
        if not isinstance(card, dict):
            continue
        if "error" in card:
            cards.append(f"GPU {gpu} ERROR {card['error']}")
            continue
        reading = card.get("card") or {}
        metrics = reading.get("metrics", {}) if isinstance(reading, dict) else {}
        cards.append(f"GPU {gpu} GPM {'supported' if card.get('gpm_supported') else 'not supported'}, "
                     f"{len(metrics)} metrics")  # fmt: skip
    return "; ".join(cards) or "no card answered"


def _xid(r: Mapping[str, Any]) -> str:
    head = f"driver {r.get('driver_version')} (branch {r.get('driver_branch')})"
    cards = [
        f"GPU {c.get('index')}: supported {c.get('supported', {}).get('mask', c.get('supported'))}, daemon mask "
        f"{'registered' if c.get('daemon_mask', {}).get('registered') else 'REFUSED'}, "
        f"wait {c.get('daemon_mask', {}).get('wait', '-')}"
        for c in r.get("cards", [])
    ]
    return "; ".join([head, *cards])


def _mps(r: Mapping[str, Any]) -> str:
    runs = r.get("runs", [])
    if not runs:
        return "no run"
    phases = ("start", "get_server_list", "quit")
    return f"{len(runs)} runs, median ms: " + ", ".join(
        f"{p} {sorted(run[p] for run in runs)[len(runs) // 2] * 1e3:.1f}" for p in phases
    )


def _tdm(r: Mapping[str, Any]) -> str:
    parts = [f"card alone {_f(r.get('card_alone'))} TFLOP/s"]
    for p in r.get("policies", []):
        together = p.get("together", {})
        cap = {None: "n/a", True: "FITS (bad)", False: "refused"}[p.get("cap_allocation")]
        text = f"{p.get('policy')}: A|B together {_f(together.get('A'))}|{_f(together.get('B'))}, 4 GiB in 2 GiB {cap}"
        uid = p.get("uid1000") or {}
        if uid:
            said = str(uid.get("skipped") or uid.get("error") or f"ran as uid {uid.get('uid')}")
            text += ", uid 1000: " + (said if len(said) <= 160 else "..." + said[-157:])
            if isinstance(uid.get("pipe"), dict):
                text += f" (pipe dir reachable: {uid['pipe'].get('reachable')})"
        parts.append(text + ("" if p.get("env_ok", True) else ", a client MISSED its partition's environment"))
    return "; ".join(parts)


def _overhead(r: Mapping[str, Any]) -> str:
    gpus = [f"GPU {g['gpu']} backend/raw {g['overhead_ratio']:.2f}x ({g['nvml_calls']} calls)" for g in r["gpus"]]
    s = r.get("sampler", {})
    return "; ".join(
        [*gpus, f"sampler cycle {_f(s.get('cycle_wall_ms'), 2)} ms vs raw {_f(s.get('raw_serial_wall_ms'), 2)} ms"]
    )


def _throughput(r: Mapping[str, Any]) -> str:
    phases = r.get("phases", {})
    return ", ".join(f"{name} {_f(p.get('tflops'))} TFLOP/s ({_f(p.get('vs_alone'), 3)})" for name, p in phases.items())


def _peers(r: Mapping[str, Any]) -> str:
    out = []
    for name, p in r.items():
        if not isinstance(p, dict):
            continue
        if "error" in p or "skipped" in p:
            out.append(f"{name}: {p.get('skipped') or 'ERROR ' + str(p.get('error'))}")
        else:
            p50, cpu = _f(p.get("scrape_p50_ms"), 2), _f(p.get("cpu_per_sample_ms"), 2)
            out.append(f"{name}: p50 {p50} ms, CPU/sample {cpu} ms, RSS {_f(p.get('rss_mib'))} MiB")
    return "; ".join(out)


def _contract(lines: Sequence[str]) -> str:
    for line in reversed(lines):
        m = PYTEST_RESULT.search(line.strip("= "))
        if m:
            return m.group(0).strip("= ")
    return ""


FIGURES: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "setup": _setup, "daemon": _daemon, "gpm": _gpm, "xid": _xid, "mps": _mps, "tdm": _tdm,
    "overhead": _overhead, "throughput": _throughput, "peers": _peers,
}  # fmt: skip


def figure_line(outcome: Outcome) -> str:
    if outcome.name == "contract":
        return _contract(outcome.tail)
    line = ""
    if isinstance(outcome.figures, dict) and outcome.name in FIGURES:
        try:
            line = FIGURES[outcome.name](outcome.figures)
        except Exception as exc:  # a figure that cannot be shown must not lose the summary
            line = f"(figures not shown: {type(exc).__name__}: {exc})"
    return line or (outcome.tail[-1] if outcome.tail else "")


def summary_text(state: Mapping[str, Any], outcomes: Sequence[Outcome]) -> str:
    counts: dict[str, int] = {}
    for o in outcomes:
        counts[o.status] = counts.get(o.status, 0) + 1
    mode = "rehearsal on the simulated node" if state["rehearse"] else "device"
    lines = [
        f"xpu-runtime-kit device check ({mode}, {'quick' if state['quick'] else 'full'}), {state['started']}",
        f"budget {state['budget_s']:g} s, step limits {state['limits_total_s']:g} s, used {state['elapsed_s']:.0f} s"
        f"{'' if state['finished'] else ' (not finished)'}"
        + (f", stopped: {state['interrupted']}" if state.get("interrupted") else "")
        + "; " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())),
    ]  # fmt: skip
    for i, o in enumerate(outcomes, 1):
        head = f"{i:>2} {o.name:<10} {o.status:<8} {o.elapsed_s:>5.1f}/{o.limit_s:<3g} s"
        lines.append(f"{head}  {figure_line(o) if o.status in ('ok', 'failed') else o.reason}".rstrip())
        if o.status in ("failed", "killed"):
            lines += [f"      | {t}" for t in o.tail[-5:]]
            if o.reason and o.status == "failed":
                lines.append(f"      | {o.reason}")
    settings = state.get("settings", {})
    lines.append(f"card settings unchanged: {settings.get('unchanged', 'not checked')}")
    lines.append(f"files: {', '.join(state.get('files', []))}")
    return "\n".join(lines)


def summary_json(state: Mapping[str, Any], outcomes: Sequence[Outcome]) -> str:
    steps = []
    for o in outcomes:
        figures = o.figures
        text = json.dumps(figures, default=str)
        if len(text) > FIGURES_MAX_CHARS:
            keys = sorted(figures) if isinstance(figures, dict) else None
            figures = {"truncated": f"{len(text)} characters: see results.tar.gz", "keys": keys}
        steps.append({
            "name": o.name, "title": o.title, "status": o.status, "rc": o.rc, "limit_s": o.limit_s,
            "elapsed_s": round(o.elapsed_s, 2), "over_limit": o.over_limit, "reason": o.reason, "tail": o.tail,
            "line": figure_line(o), "figures": figures,
        })  # fmt: skip
    return json.dumps({**state, "steps": steps}, indent=1, default=str) + "\n"


__all__ = ["figure_line", "summary_json", "summary_text"]
