"""`benchfarm users add|list|revoke|login|whoami|log`: who may use a shared farm, and what
they did.

``add NAME [--admin] [--save]`` makes a user and prints their token once (``--save`` keeps it
in your own token file instead: the first admin's set-up); ``login`` saves a token an admin
gave you in your token file (mode 0600); ``revoke NAME`` ends a token; ``whoami`` says who the
store takes you for; ``list`` and ``log`` (the audit trail: who did what, for whom, when) read
the store. Adding and revoking need an admin; while the store has no users, you are its admin.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from harness.commands.arguments import add_paging, page_note
from harness.commands.context import caller_of, store_of
from harness.commands.table import format_table

if TYPE_CHECKING:
    from db.store import Store


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("users", help="the farm's users, their tokens, and who did "
                                                 "what")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    add = actions.add_parser("add", help="add a user and print their token once (admins)")
    add.add_argument("name", metavar="NAME")
    add.add_argument("--admin", action="store_true",
                     help="may add and revoke users and act on others' jobs and reservations")
    add.add_argument("--save", action="store_true",
                     help="keep the token in your own token file instead of printing it "
                          "(a user for yourself: the first admin)")
    revoke = actions.add_parser("revoke", help="end a user's token (admins)")
    revoke.add_argument("name", metavar="NAME")
    actions.add_parser("login", help="save the token an admin gave you (read from stdin) in "
                                     "your token file, mode 0600")
    actions.add_parser("whoami", help="who the store takes you for")
    actions.add_parser("list", help="the users, admins and revoked ones")
    log = actions.add_parser("log", help="who did what, for whom, when; newest first")
    log.add_argument("--user", metavar="NAME", help="only what NAME did or had done for them")
    add_paging(log, "actions", 50)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.action in ("add", "login"):  # the first user may be a new store's
        with store_of(args) as store:
            return _add(store, args) if args.action == "add" else _login(store)
    with store_of(args, create=False) as store:
        if args.action == "revoke":
            return _revoke(store, args.name)
        if args.action == "list":
            return _list(store)
        if args.action == "log":
            return _log(store, args)
        print(caller_of(store).shown)
    return 0


def _add(store: Store, args: argparse.Namespace) -> int:
    from harness.access.tokens import (
        TokenError,
        new_token,
        token_file,
        token_sha256,
        write_token_file,
    )

    name, admin, save = args.name, args.admin, args.save
    caller = caller_of(store)
    caller.require_admin("adding a user")
    path = token_file()
    if save and path.exists():
        raise TokenError(f"token file {path} exists; remove it first, or add {name} without "
                         "--save")
    token = new_token()
    store.users.add(name, admin, token_sha256(token),
                    caller.event("user-add", f"user {name}", detail="admin" if admin else None))
    role = "an admin" if admin else "a user"
    if save:
        write_token_file(path, token)
        print(f"added {name}, {role}; the token is in {path} (mode 0600): benchfarm now takes "
              f"you for {name}")
        return 0
    print(token)
    print(f"added {name}, {role}. The line above is their token, shown this once: give it to "
          f"{name} privately; they save it with `benchfarm users login` (it reads the token "
          "from stdin)", file=sys.stderr)
    return 0


def _revoke(store: Store, name: str) -> int:
    caller = caller_of(store)
    caller.require_admin("revoking a user")
    store.users.revoke(name, caller.event("user-revoke", f"user {name}"))
    print(f"revoked {name}: their token opens nothing any more")
    return 0


def _login(store: Store) -> int:
    import getpass

    from harness.access.caller import user_of_token
    from harness.access.tokens import TokenError, check_token, token_file, write_token_file

    if not store.users.exist():
        raise TokenError("this store has no users: benchfarm takes you for its admin, no token "
                         "needed (`benchfarm users add NAME --admin --save` makes the first)")
    text = getpass.getpass("token: ") if sys.stdin.isatty() else sys.stdin.readline(2048)
    token = check_token(text.strip(), "the token given")
    user = user_of_token(store, token)
    if user is None:
        raise TokenError("that token is no active user's of this store; ask an admin for "
                         "yours (`benchfarm users add NAME`)")
    path = token_file()
    write_token_file(path, token)
    print(f"saved {user.name}'s token in {path} (mode 0600)")
    return 0


def _list(store: Store) -> int:
    from harness.errors import printable

    users = store.users.list()
    if not users:
        print("no users: whoever runs benchfarm on this store is its admin; `benchfarm users "
              "add NAME --admin --save` makes the first")
        return 0
    print(format_table(
        ["user", "admin", "added (UTC)", "by", "revoked (UTC)", "by"],
        [[u.name, "yes" if u.admin else "no", f"{u.created_at:%Y-%m-%d %H:%M}",
          printable(u.created_by), u.revoked_at and f"{u.revoked_at:%Y-%m-%d %H:%M}",
          u.revoked_by and printable(u.revoked_by)] for u in users]))
    return 0


def _log(store: Store, args: argparse.Namespace) -> int:
    from harness.errors import printable

    entries = store.audit.entries(args.limit or None, args.offset, args.user)
    total = store.audit.count(args.user)
    if not entries:
        print("no actions recorded" + (f" by or for {args.user}" if args.user else ""))
        return 0
    print(format_table(
        ["at (UTC)", "who", "for", "action", "target", "detail"],
        [[f"{e.at:%Y-%m-%d %H:%M:%S}", printable(e.actor) + ("" if e.checked else " (local)"),
          e.acting_for and printable(e.acting_for), e.action, printable(e.target),
          e.detail and printable(e.detail)] for e in entries]))
    note = page_note(len(entries), args.offset, total, "actions")
    if note:
        print(note)
    return 0
