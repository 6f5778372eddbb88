"""`benchfarm web`: the live dashboard of the store (boards, queue, progress, experiments).

Read-only, and on 127.0.0.1 unless --host says otherwise. Once the store has users, every
request carries one's token (harness.access); a single operator may instead give a shared
token (--token or $BENCHFARM_WEB_TOKEN, at least 16 characters). Any address other than
loopback needs one or the other.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path

from harness import REPO_ROOT
from harness.errors import InputError, RunFailure

TOKEN_ENV = "BENCHFARM_WEB_TOKEN"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("web", help="serve a live dashboard of the store (read-only)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default %(default)s; any other than "
                             "loopback needs a token)")
    parser.add_argument("--port", type=port_number, default=8765,
                        help="port (default %(default)s)")
    parser.add_argument("--token", default=os.environ.get(TOKEN_ENV) or None,
                        help=f"a shared token that opens the dashboard besides the users' "
                             f"own, 16 characters or more (default: ${TOKEN_ENV}); prefer the "
                             "variable, a flag shows in `ps`")
    parser.add_argument("--claims", type=Path, default=REPO_ROOT / "claims",
                        help="folder of the claims files the audit page offers (default: the "
                             "checkout's claims/)")
    parser.set_defaults(func=run)


def port_number(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (0-65535)")
    return value


def listening_socket(host: str, port: int, token: str | None,
                     has_users: Callable[[], bool] = lambda: False) -> socket.socket:
    """The bound socket; refused for a non-loopback address without a token, unless the store
    has users (``has_users``: asked only then), whose tokens log in."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise InputError(f"--host {host!r}: cannot resolve it ({exc.strerror})") from None
    loopback = all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in infos)
    if not loopback and not token and not has_users():
        raise InputError(f"--host {host}: not a loopback address, so the dashboard needs a "
                         f"token: add the store's users (`benchfarm users add NAME`), who log "
                         f"in with their own, or set ${TOKEN_ENV} (or --token) to a shared one "
                         "and send it with each request")
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise RunFailure(f"cannot listen on {host}:{port} ({exc.strerror}); choose another "
                         "--port") from None
    return sock


def store_has_users(url: str) -> bool:
    """Whether the store at ``url`` has users (read as the dashboard reads it: never created
    nor migrated); False when it cannot be read."""
    from db.connection import DatabaseFailure
    from db.errors import StoreError
    from harness.web.data import FarmData

    data = FarmData(url, REPO_ROOT)
    try:
        return data.users_exist()
    except (StoreError, DatabaseFailure):
        return False
    finally:
        data.close()


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from harness.access.tokens import check_token
    from harness.web.app import create_app

    token = None if args.token is None else check_token(args.token, f"--token (or ${TOKEN_ENV})")
    sock = listening_socket(args.host, args.port, token, lambda: store_has_users(args.db))
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    print(f"benchfarm web: http://{shown}:{port}/ (read-only"
          + (", token required" if token else "") + "; users log in with their tokens once "
          "the store has users); Ctrl-C stops", file=sys.stderr, flush=True)
    config = uvicorn.Config(create_app(args.db, token, args.claims), log_level="warning",
                            access_log=False)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()
    return 0
