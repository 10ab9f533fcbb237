"""`xpuctl web hash-password`: a bcrypt hash for ``basic_auth_users`` of the /metrics web config file.

Uses the bcrypt the daemon itself verifies with, so no htpasswd (apache2-utils) or extra Python package is needed.
bcrypt is imported only when a hash is asked for: the rest of xpuctl runs without it.
"""

from __future__ import annotations

import argparse
import getpass
import sys

import grpc

from healthd.commands.output import print_json, wants_json

BCRYPT_MAX_BYTES = 72  # bcrypt ignores (or, in newer versions, refuses) anything past the 72nd byte
DEFAULT_COST = 12


def read_password(prompt: bool) -> str:
    """Twice from the terminal, hidden; or one line from stdin (``printf '%s\\n' "$PW" | xpuctl ...``)."""
    if prompt:
        first = getpass.getpass("Password: ")
        if getpass.getpass("Again: ") != first:
            raise ValueError("the two passwords differ")
        return first
    line = sys.stdin.readline()
    return line[:-1] if line.endswith("\n") else line


def hash_password(password: str, cost: int) -> str:
    raw = password.encode()
    if not raw:
        raise ValueError("the password is empty")
    if len(raw) > BCRYPT_MAX_BYTES:
        raise ValueError(f"the password is {len(raw)} bytes; bcrypt uses at most {BCRYPT_MAX_BYTES}")
    try:
        import bcrypt
    except ImportError as exc:
        raise ValueError(
            f"hash-password needs the Python package bcrypt, which is not installed here ({exc})"
        ) from None
    return bcrypt.hashpw(raw, bcrypt.gensalt(rounds=cost)).decode()


def cmd_hash_password(args: argparse.Namespace, channel: grpc.Channel) -> int:
    if not 4 <= args.cost <= 31:
        raise ValueError(f"--cost: bcrypt takes 4 to 31, got {args.cost}")
    password = read_password(prompt=sys.stdin.isatty() and not args.stdin)
    hashed = hash_password(password, args.cost)
    if wants_json(args):
        print_json({"hash": hashed})
    else:
        print(hashed)
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    web = sub.add_parser("web", help="helpers for the /metrics web config file (TLS, basic auth)")
    web_sub = web.add_subparsers(dest="action", required=True)
    hashp = web_sub.add_parser(
        "hash-password",
        help="print a bcrypt hash for basic_auth_users",
        description="Asks twice on a terminal; otherwise reads one line from stdin. Prints only the hash.",
    )
    hashp.add_argument(
        "--cost", type=int, default=DEFAULT_COST, help="bcrypt cost: 2^COST rounds (default %(default)s)"
    )
    hashp.add_argument("--stdin", action="store_true", help="read the password from stdin even on a terminal")
    hashp.set_defaults(func=cmd_hash_password)
