"""The one exception type for mistakes a user can fix (bad input, unknown names, bad config).

The CLI prints it as a single line and exits non-zero; anything else is a bug and keeps its traceback.
"""


class UserError(Exception):
    """A problem in what the user asked for or fed in; ``str(err)`` is the whole message."""

    exit_code = 2
