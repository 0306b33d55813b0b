"""Errors a user can act on.

Raise `UserError` for an expected mistake (a missing path, an impossible setting, a model of the wrong kind):
its message says in one or two lines what to change. The `hf-vrl` command prints that message alone and exits
with status 2; `--debug` shows the traceback as well.
"""

from __future__ import annotations

__all__ = ["UserError"]


class UserError(Exception):
    """An expected, user-fixable error; the message names what to change."""
