# errors.py -- the one error type a command raises for bad input: its message is the line the user sees.
"""`cli.main` prints the message once on stderr and exits with `exit_code` (2: usage or input error).
Library code raises it (or a ValueError subclass such as config.ConfigError, which cli.main treats the same);
commands never print-and-return for an error."""
from __future__ import annotations


class UserError(Exception):
    def __init__(self, message: str, exit_code: int = 2):
        super().__init__(message)
        self.exit_code = exit_code
