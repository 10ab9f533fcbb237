"""Checks the daemon runs before it builds anything, so a bad setting is one line that names it, not a traceback.

``check_references`` is what ``--check-config`` adds to parsing: listen addresses that parse and resolve, a
scenario that loads. ``check_state_dir`` runs at start only: the directory must exist (or be creatable) and take
a file. Each message names the setting as the operator gave it: the flag (``--metrics-listen``) or the config
file's key (``daemon.metrics_listen in /etc/xpu-runtime-kit/healthd.toml``).
"""

from __future__ import annotations

import os
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path

from exporter.backends.scenario import ScenarioError, load_scenario
from exporter.http import parse_listen_address
from healthd.daemon.config import Config
from healthd.rpc.addresses import check_grpc_address

QUOTE_LIMIT = 100  # characters of an operator's value quoted back in a message


class StartupError(Exception):
    """A start-up problem the operator has to fix; its message is the whole line the daemon prints."""


@dataclass(frozen=True, slots=True)
class OptionNames:
    """How each setting was given: a flag (``--metrics-listen``), or a key of the config file (with the file)."""

    flags: frozenset[str] = frozenset()  # settings given on the command line: metrics_listen, grpc_listen, ...
    source: str = "defaults"  # the config file the others came from

    def name(self, field: str) -> str:
        """``--metrics-listen`` or ``daemon.metrics_listen``."""
        return f"--{field.replace('_', '-')}" if field in self.flags else f"daemon.{field}"

    def where(self, field: str, value: object) -> str:
        """The start of a message: ``--metrics-listen 'garbage'`` or ``daemon.metrics_listen = 'x' (in FILE)``."""
        if field in self.flags:
            return f"{self.name(field)} {quote(value)}"
        in_file = f" (in {self.source})" if self.source not in ("defaults", "") else ""
        return f"{self.name(field)} = {quote(value)}{in_file}"

    @property
    def metrics_listen(self) -> str:
        return self.name("metrics_listen")


def option_names(*, source: str, flags: set[str]) -> OptionNames:
    """``flags``: the settings given on the command line (``metrics_listen`` ...); the others came from ``source``."""
    return OptionNames(frozenset(flags), source)


def quote(value: object) -> str:
    """repr() of an operator's value, cut to QUOTE_LIMIT characters so a message stays one readable line."""
    text = repr(value)
    return text if len(text) <= QUOTE_LIMIT else text[: QUOTE_LIMIT - 3] + "..."


def check_references(config: Config, names: OptionNames) -> None:
    """Everything --check-config can verify without binding or writing: addresses and the scenario."""
    _check_metrics_listen(config.metrics_listen, names.where("metrics_listen", config.metrics_listen))
    for address in config.grpc_addresses:
        _check_grpc_listen(address, names.where("grpc_listen", address))
    if config.simulate:
        where = names.where("simulate", config.simulate)
        try:
            load_scenario(config.simulate)
        except ScenarioError as exc:
            raise StartupError(f"{where}: {exc}") from None
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not UTF-8 text"
            raise StartupError(f"{where}: cannot read the scenario: {reason}") from None


def check_state_dir(state_dir: Path, names: OptionNames) -> None:
    """The state directory exists (made if missing) and takes a new file; raises StartupError naming it."""
    where = names.where("state_dir", str(state_dir))
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise StartupError(f"{where}: exists and is not a directory") from None
    except OSError as exc:
        raise StartupError(f"{where}: cannot create the state directory: {exc.strerror or exc}") from None
    if not state_dir.is_dir():
        raise StartupError(f"{where}: not a directory")
    try:
        with tempfile.NamedTemporaryFile(dir=state_dir, prefix=".write-test-"):
            pass
    except OSError as exc:
        raise StartupError(
            f"{where}: cannot write in the state directory as uid {os.getuid()}: {exc.strerror or exc}"
        ) from None


STATE_UMASK = 0o027  # the packaged unit's UMask=: files 0640 and directories 0750 at most


def restrict_state(state_dir: Path) -> None:
    """Keep other local users out of the state (the fault journal names processes, pids and pods), also outside
    the packaged unit (``./dev run``, the DaemonSet's hostPath, which kubelet creates 0755): the unit's umask for
    everything the daemon creates, and no access for others to the state directory itself. Modes that must be
    wider (MPS pipe directories, sockets) are set explicitly where they are made."""
    os.umask(os.umask(STATE_UMASK) | STATE_UMASK)
    try:
        mode = state_dir.stat().st_mode
        if mode & 0o007:
            state_dir.chmod(mode & 0o7770)
    except OSError:  # not ours to change (an operator's own directory): the umask still covers new files
        pass


def check_socket_dirs(config: Config, names: OptionNames) -> None:
    """The directory of each unix socket exists or can be made (the gRPC server makes it at start)."""
    for address in config.grpc_addresses:
        if not address.startswith("unix:"):
            continue
        directory = Path(address[len("unix:") :]).parent
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except FileExistsError:
            raise StartupError(f"{names.where('grpc_listen', address)}: {directory} is not a directory") from None
        except OSError as exc:
            where = names.where("grpc_listen", address)
            raise StartupError(f"{where}: cannot create {directory}: {exc.strerror or exc}") from None
    if config.partitions.enabled:
        admin = config.admin_socket
        where = names.where("admin_socket", str(admin))
        try:
            admin.parent.mkdir(parents=True, exist_ok=True)
        except FileExistsError:
            raise StartupError(f"{where}: {admin.parent} is not a directory") from None
        except OSError as exc:
            raise StartupError(f"{where}: cannot create {admin.parent}: {exc.strerror or exc}") from None


def _check_metrics_listen(value: str, where: str) -> None:
    try:
        host, port = parse_listen_address(value)
    except ValueError as exc:
        raise StartupError(f"{where}: {exc}") from None
    _resolve(host, port, where)


def _check_grpc_listen(address: str, where: str) -> None:
    """The shared syntax check (``where`` already quotes the value, so the reason is said without it), then resolve."""
    unix = address.startswith("unix:")
    try:
        check_grpc_address(address)
    except ValueError:
        reason = "the unix socket path must be absolute" if unix else "expected unix:/path or HOST:PORT"
        raise StartupError(f"{where}: {reason}") from None
    if not unix:
        host, _, port = address.rpartition(":")
        _resolve(host.strip("[]"), int(port), where)


def _resolve(host: str, port: int, where: str) -> None:
    """A listen host must be an address of this machine or a name that resolves to one."""
    try:
        socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, ValueError) as exc:  # UnicodeError (a label over 63 characters) is a ValueError
        reason = exc.strerror if isinstance(exc, socket.gaierror) else "not a valid host name"
        raise StartupError(f"{where}: cannot resolve host {quote(host)} ({reason})") from None


MOVABLE_STATE = ("faults", "partitions")


def move_aside_state(state_dir: Path, kind: str, names: OptionNames) -> str:
    """``--move-aside faults|partitions``: rename the file if, and only if, it is corrupt; returns what to print.

    A readable file is never moved (that would drop good state); StartupError says so.
    """
    from healthd.daemon.health import JOURNAL_FILE
    from healthd.faults.journal import Journal
    from healthd.partition.component import STATE_FILE
    from healthd.partition.store import Store
    from healthd.state_files import StateFileError, move_aside_if_corrupt

    path = state_dir / (JOURNAL_FILE if kind == "faults" else STATE_FILE)
    if not path.exists():
        raise StartupError(f"{names.where('state_dir', str(state_dir))}: there is no {path.name} to move aside")
    try:
        outcome = move_aside_if_corrupt(path, Journal if kind == "faults" else Store)
    except StateFileError as exc:
        raise StartupError(str(exc)) from None
    if outcome is None:
        raise StartupError(f"{path} is readable; nothing moved (it is not corrupt, so the daemon can start with it)")
    moved, corruption = outcome
    return f"moved {path} to {moved} ({corruption.reason}). {corruption.lost}"
