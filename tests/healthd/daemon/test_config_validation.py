"""Bad configuration gets one clear line naming the option, never a traceback; the shipped default file is valid."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from healthd.daemon.config import Config, ConfigError, load_config, parse_config
from healthd.daemon.reload import flatten, plan_reload
from tests.support.paths import REPO

SHIPPED = REPO / "packaging" / "healthd.toml"


def known_keys(*path: str) -> set[str]:
    """The keys the parser accepts in the table at ``path``, read from its "unknown option (known: ...)" message."""
    data: dict[str, Any] = {}
    cursor = data
    for name in path:
        cursor = cursor.setdefault(name, {})
    cursor["zz_not_an_option"] = 1
    with pytest.raises(ConfigError) as err:
        parse_config(data)
    match = re.search(r"unknown option \(known: (.*)\)$", str(err.value))
    assert match, str(err.value)
    return set(match.group(1).split(", "))


SECTIONS = {section: sorted(known_keys(section)) for section in sorted(known_keys())}
OPTION_NAMES = {f"{s}.{k}" for s, keys in SECTIONS.items() for k in keys} | set(SECTIONS)


def run_check(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "healthd", "--check-config", "--config", str(path)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        check=False,
    )


# ----- the CLI, as an operator runs it -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "option", "what"),
    [
        ("[daemon]\nlog_level = 'loud'\n", "daemon.log_level", "must be one of"),
        ("[daemon]\nmetrics_listen = ':99999'\n", "daemon.metrics_listen", "port must be a number"),
        ("[daemon]\ngrpc_listen = ['relative.sock']\n", "daemon.grpc_listen", "expected unix:/path or HOST:PORT"),
        ("[daemon]\ngrpc_listen = ['unix:run/x.sock']\n", "daemon.grpc_listen", "must be absolute"),
        (
            f"[daemon]\ngrpc_listen = ['127.0.0.1:{'9' * 5000}']\n",
            "daemon.grpc_listen",
            "expected unix:/path or HOST:PORT",
        ),
        ("[daemon]\ngrpc_listen = ['0.0.0.0:9411']\n", "daemon.grpc_listen", "needs mTLS"),
        ("[daemon]\nstate_dir = 'var/lib'\n", "daemon.state_dir", "absolute path"),
        ("[daemon]\nbogus = 1\n", "daemon.bogus", "unknown option"),
        ("[sampler]\ninterval_seconds = 0\n", "sampler.interval_seconds", "between"),
        ("[sampler]\ncall_deadline_seconds = 'fast'\n", "sampler.call_deadline_seconds", "expected a number"),
        ("[transport]\ngrpc_socket_mode = '0666'\n", "transport.grpc_socket_mode", "every local user"),
        ("[transport]\ngrpc_socket_mode = 'rw'\n", "transport.grpc_socket_mode", "octal"),
        ("[transport]\nmetrics_web_config_file = 'web.yml'\n", "transport.metrics_web_config_file", "absolute"),
        ("[transport]\nmetrics_web_config_file = '/nonexistent/web.yml'\n", "transport.metrics_web_config_file", ""),
        ("transport = 3\n", "transport", "expected a table"),
        ("[sampler\n", "config file", "not valid TOML"),
    ],
)
def test_check_config_names_the_option(tmp_path: Path, text: str, option: str, what: str) -> None:
    path = tmp_path / "healthd.toml"
    path.write_text(text)
    result = run_check(path)
    assert result.returncode == 2, result
    assert result.stdout == ""
    line = result.stderr.strip()
    assert "\n" not in line, line
    assert "Traceback" not in line, line
    assert line.startswith(f"xpu-healthd: {option}"), line
    assert what in line


def test_check_config_on_a_missing_file_and_a_good_one(tmp_path: Path) -> None:
    result = run_check(tmp_path / "absent.toml")
    assert result.returncode == 2
    assert result.stderr.startswith("xpu-healthd: config file")
    assert "not found" in result.stderr
    good = tmp_path / "good.toml"
    good.write_text("[daemon]\nlog_level = 'debug'\n[transport]\ngrpc_socket_mode = 0o640\n")
    result = run_check(good)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"configuration OK ({good})"


def test_shipped_default_config_is_valid_and_documents_every_option() -> None:
    result = run_check(SHIPPED)
    assert result.returncode == 0, result.stderr
    text = SHIPPED.read_text()
    # every option appears commented out with its default, so uncommenting all of them changes nothing
    uncommented = re.sub(r"^#(?=\s*[a-z_]+ = )\s*", "", text, flags=re.M)
    data = tomllib.loads(uncommented)
    assert flatten(parse_config(data)) == flatten(Config())

    def walk(table: dict[str, Any], path: tuple[str, ...]) -> None:
        for key in known_keys(*path):
            if isinstance(table.get(key), dict):
                walk(table[key], (*path, key))
            elif key not in table:  # options without a default value are described in words
                assert re.search(rf"^#.*\b{key}\b", text, flags=re.M), f"{'.'.join((*path, key))} is not documented"

    walk(data, ())


# ----- parse_config in bulk (hypothesis) ----------------------------------------------------------------------

toml_scalars = (
    st.text(max_size=20)
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.booleans()
    | st.dates()
    | st.datetimes()
)
toml_values = st.recursive(
    toml_scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
)
option_keys = st.sampled_from([k for keys in SECTIONS.values() for k in keys])
section = st.dictionaries(option_keys | st.text(max_size=10), toml_values, max_size=4)
documents = st.dictionaries(st.sampled_from(sorted(SECTIONS)) | st.text(max_size=8), section | toml_values, max_size=3)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents)
def test_any_document_is_a_config_or_a_named_error(data: dict[str, Any]) -> None:
    try:
        config = parse_config(data)
    except ConfigError as exc:
        message = str(exc)
        assert "\n" not in message
        named = {f"{o}{sep}" for o in OPTION_NAMES for sep in (": ", "/", ".")}
        for name, table in data.items():  # an unknown key is named as written (quoted when it is no identifier)
            shown = name if name.isidentifier() else repr(name)
            named.add(f"{shown}: unknown option")
            if isinstance(table, dict):
                named |= {f"{name}.{k if k.isidentifier() else repr(k)}: unknown option" for k in table}
        assert any(message.startswith(prefix) for prefix in named), message
    else:
        assert isinstance(config, Config)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(OPTION_NAMES - set(SECTIONS))), toml_values)
def test_any_value_for_a_known_option_is_accepted_or_named(option: str, value: Any) -> None:
    section_name, key = option.split(".")
    message = f"{option}: accepted"
    try:
        parse_config({section_name: {key: value}})
    except ConfigError as exc:
        message = str(exc)
    assert message.startswith((f"{option}: ", f"{option}.")), message


def test_reload_plan_separates_safe_changes_from_restarts() -> None:
    old = parse_config({"daemon": {"log_level": "info"}, "sampler": {"interval_seconds": 5}})
    new = parse_config(
        {
            "daemon": {"log_level": "debug", "metrics_listen": ":9500"},
            "sampler": {"interval_seconds": 5},
            "transport": {"metrics_web_config_file": "/etc/xpu-runtime-kit/web.yml"},
        }
    )
    plan = plan_reload(old, new)
    assert plan.applied == ("daemon.log_level", "transport.metrics_web_config_file")
    assert plan.needs_restart == ("daemon.metrics_listen",)
    assert plan.config.log_level == "debug"
    assert plan.config.metrics_listen == old.metrics_listen  # not taken over
    assert str(plan.config.transport.metrics_web_config_file) == "/etc/xpu-runtime-kit/web.yml"


def test_reload_plan_names_health_options_as_the_file_does() -> None:
    old = parse_config({})
    new = parse_config({"health": {"ecc": {"correctable_rate_per_hour": 50}, "xid": {"merge_window_seconds": 5}}})
    assert plan_reload(old, new).needs_restart == (
        "health.ecc.correctable_rate_per_hour",
        "health.xid.merge_window_seconds",
    )


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_any_file_content_is_a_config_or_a_named_error(tmp_path_factory: pytest.TempPathFactory, raw: bytes) -> None:
    path = tmp_path_factory.mktemp("cfg") / "healthd.toml"
    path.write_bytes(raw)
    message = "accepted"
    try:
        load_config(path)
    except ConfigError as exc:
        message = str(exc)
    assert (
        message == "accepted"
        or message.startswith(
            (f"config file {path}: ", *(f"{o}: " for o in OPTION_NAMES), *(f"{o}/" for o in OPTION_NAMES))
        )
        or ": unknown option" in message
    ), message
