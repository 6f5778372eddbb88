"""The command line's shared flags and argument types (no command imports another)."""

from __future__ import annotations

import argparse


def device_list(text: str) -> list[str]:
    """--devices: device names or classes, comma-separated."""
    return [item for item in text.split(",") if item]


def run_count(text: str) -> int:
    """--max-runs: a whole number, at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


MAX_SECONDS = 86400.0  # a day: the most any duration flag may be (inf or 1e12 never ends)


def positive_seconds(text: str) -> float:
    """--lease-ttl, --poll: a positive number of seconds, at most MAX_SECONDS."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value <= MAX_SECONDS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds above 0 and at "
                                         f"most {MAX_SECONDS:g}")
    return value


INVENTORY_HELP = ("inventory TOML (default: $BENCHFARM_INVENTORY, else the local farm's if it "
                  "is up, else only `local`)")


def add_devices(parser: argparse.ArgumentParser, default: str = "the spec's",
                help_text: str | None = None) -> None:
    parser.add_argument("--devices", type=device_list, action="extend", help=help_text or
                        f"device names or classes, comma-separated (default: {default})")


def add_inventory(parser: argparse.ArgumentParser, help_text: str | None = None) -> None:
    parser.add_argument("--inventory", help=help_text or
                        "inventory TOML (default: as for `benchfarm run`)")


def add_ray_address(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ray-address", help="join this Ray cluster instead of starting one")


def add_lease_ttl(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--lease-ttl", type=positive_seconds,
                        help="board lease time in seconds (default: $BENCHFARM_LEASE_TTL_S "
                             "or 30)")
