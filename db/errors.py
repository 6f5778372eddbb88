"""Errors of the result store, with the ``exit_code`` convention the CLI maps to exit codes.

``db`` imports none of the other benchfarm packages, so it defines its own pair here.
"""


class StoreError(Exception):
    """A failure while using the store (cannot connect, a write failed, schema too new)."""

    exit_code = 1


class StoreInputError(StoreError):
    """The user asked for something invalid: a malformed URL, an unknown run or experiment."""

    exit_code = 2
