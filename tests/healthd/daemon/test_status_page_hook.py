"""The status page of a real daemon and the reference hook: where each active fault stands with the hook."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.healthd.daemon.test_status_page import Page
from tests.support.daemon_process import DaemonProcess
from tests.support.hook_process import start_hook, stop_hook
from tests.support.waiting import wait_until


@pytest.mark.e2e
def test_the_page_says_whether_the_hook_got_each_fault(tmp_path: Path) -> None:
    """The real daemon and the reference hook: a failing command shows as failing with the hook's error, then as
    delivered once the command succeeds; an application XID is not for the hook."""
    flag = tmp_path / "hook-may-succeed"
    hook = start_hook(f"unix:{tmp_path / 'hook.sock'}", f"test -e {flag} || exit 127", tmp_path / "hook.sqlite")
    config = f'[hook]\nendpoints = ["unix:{tmp_path / "hook.sock"}"]\nbackoff_initial_seconds = 0.1\n'
    try:
        with DaemonProcess(tmp_path, extra_config=config + "backoff_max_seconds = 0.5\n") as d:
            for args in (("--gpu", "2", "code=79"), ("--gpu", "4", "code=13")):
                assert d.xpuctl("simulate", "inject", "xid", *args).returncode == 0
            page = wait_until(lambda: _page_when(d, "failing ("), "the hook failing", 30, step=0.1)
            assert page.banner[0] == "bad"
            assert "failing for flt-" in page.banner[1] and "exit 127" in page.banner[1], page.banner
            assert "not for the hook" in page.words  # the XID 13 fault, restart_app
            flag.touch()
            page = wait_until(lambda: _page_when(d, ">delivered</span>"), "the hook delivered", 30, step=0.1)
            assert "failing for" not in page.banner[1]
    finally:
        stop_hook(hook)


@pytest.mark.e2e
def test_without_a_hook_the_page_says_a_replace_node_fault_reaches_no_one(tmp_path: Path) -> None:
    with DaemonProcess(tmp_path) as d:
        assert d.xpuctl("simulate", "inject", "xid", "--gpu", "2", "code=79").returncode == 0
        page = wait_until(lambda: _page_when(d, "no hook configured"), "the fault on the page", 30, step=0.1)
        assert "no hook configured: 1 replace_node fault(s) reach no one" in page.banner[1]


def _page_when(d: DaemonProcess, text: str) -> Page | None:
    body = d.get("/")[1]
    return Page(body) if text in body else None
