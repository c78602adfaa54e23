"""The one error type the command line shows as a single line: `UserError`, something the person running trace-rl
can fix (a setting, a file they named, a damaged run directory). Its message is one line that names the setting
or file and what is allowed.

`trace-rl` prints a UserError as `trace-rl CMD: error: MESSAGE` with exit code 2 and no traceback; every other
exception is treated as a bug in trace-rl and keeps its traceback (exit code 1). So raise UserError only where the
cause is known to be the user's input; a ValueError deep inside a computation stays a ValueError. It lives at the
bottom of the package (standard library only) so that every layer can raise it.
"""

from __future__ import annotations


class UserError(Exception):
    """A problem the user can fix; the message is one line naming the setting or file and what is allowed."""


class ConfigError(UserError, ValueError):
    """A bad setting (a ValueError too, for callers that validate a config and catch ValueError)."""


class MissingFileError(UserError, FileNotFoundError):
    """A file or folder the user named, or must provide, is not there."""
