"""PyYAML and bcrypt are needed only by what uses them: a web config file, and basic-auth users in it. Without
them the daemon runs as long as neither is configured, and a configuration that needs one is refused with a message
naming the package (the device machine the GPU check runs on has no bcrypt)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from exporter.webconfig import BasicAuthenticator, WebConfigError, load_web_config, parse_web_config
from tests.support.paths import REPO

HASH = "$2b$04$" + "a" * 53  # the shape of a bcrypt hash; never checked against a password here


def block(monkeypatch: pytest.MonkeyPatch, module: str) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # `import module` now raises ImportError, as if not installed


def test_a_web_config_file_without_pyyaml_names_the_package(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    web = tmp_path / "web.yml"
    web.write_text("basic_auth_users: {}\n")
    block(monkeypatch, "yaml")
    with pytest.raises(WebConfigError, match=r"^web config file .*web\.yml: needs the Python package PyYAML"):
        load_web_config(web)


def test_basic_auth_users_without_bcrypt_are_refused_when_the_file_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    block(monkeypatch, "bcrypt")
    with pytest.raises(WebConfigError, match=r"^basic_auth_users: needs the Python package bcrypt"):
        parse_web_config({"basic_auth_users": {"prometheus": HASH}}, base_dir=Path("/"))
    with pytest.raises(WebConfigError, match="bcrypt"):
        BasicAuthenticator({"prometheus": HASH.encode()})


def test_no_basic_auth_needs_no_bcrypt(monkeypatch: pytest.MonkeyPatch) -> None:
    block(monkeypatch, "bcrypt")
    config = parse_web_config({"basic_auth_users": {}}, base_dir=Path("/"))
    auth = BasicAuthenticator(config.basic_auth_users)
    assert not auth.enabled
    assert auth.check(None) and auth.check("Basic garbage")  # basic auth off: every request passes


def test_the_daemon_refuses_basic_auth_without_bcrypt_naming_the_option(tmp_path: Path) -> None:
    """--check-config, in a process where bcrypt cannot be imported: exit 2 and one line naming the option."""
    web = tmp_path / "web.yml"
    web.write_text(f"basic_auth_users:\n  prometheus: '{HASH}'\n")
    config = tmp_path / "healthd.toml"
    config.write_text(f'[transport]\nmetrics_web_config_file = "{web}"\n')
    code = (
        "import sys; sys.modules['bcrypt'] = None; from healthd.main import main; "
        f"sys.exit(main(['--config', {str(config)!r}, '--simulate', 'h200x1', '--check-config']))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "transport.metrics_web_config_file: basic_auth_users: needs the Python package bcrypt" in done.stderr


def test_xpuctl_hash_password_without_bcrypt_says_so(tmp_path: Path) -> None:
    code = "import sys; sys.modules['bcrypt'] = None; from healthd.cli import main; sys.exit(main())"
    done = subprocess.run(
        [sys.executable, "-c", code, "web", "hash-password", "--stdin"],
        cwd=REPO,
        input="secret\n",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "hash-password needs the Python package bcrypt" in done.stderr
