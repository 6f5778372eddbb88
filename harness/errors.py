"""Errors the command line turns into exit codes.

Every project exception that a user can act on carries an ``exit_code`` class attribute:
2 for bad input (a file, a flag, a name), 1 for a failure while running. ``devices`` and ``db``
follow the same convention without importing this module (they import none of the others).
"""


class BenchfarmError(Exception):
    exit_code = 1


class InputError(BenchfarmError):
    """The user gave something invalid: a file, a key, a flag value."""

    exit_code = 2


class RunFailure(BenchfarmError):
    """Something failed while running (a build, a remote command, a store write)."""

    exit_code = 1
