"""The one exception type for user mistakes: the CLI prints it as one line and exits 2."""


class UserError(Exception):
    """Bad input: a file, a key, a value or a request the tool cannot honour.

    `where` names the file (or `-o` override) and `key` the dotted config key, so that the one-line
    message says what to fix without a traceback.
    """

    def __init__(self, message: str, where: str | None = None, key: str | None = None):
        self.message = message
        self.where = where
        self.key = key
        super().__init__(str(self))

    def __str__(self) -> str:
        parts = [p for p in (self.where, self.key) if p]
        return ": ".join(parts + [self.message])


class WorkFailed(Exception):
    """The work itself failed (a job, a check): exit code 1."""
