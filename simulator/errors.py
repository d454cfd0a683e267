"""User-facing errors.

Every problem with user input (a YAML file, a trace, a latency table) is raised as a
`ConfigError`. The CLI prints it as one line, `FILE: key.path: what was expected`, and exits with
code 2, never a traceback. Internal bugs stay ordinary exceptions.
"""


class ConfigError(Exception):
    """Bad user input. `where` is the file (or "<cli>"), `key` the dotted key path."""

    def __init__(self, where: str, key: str, message: str):
        self.where = where
        self.key = key
        self.message = message
        super().__init__(self.one_line())

    def one_line(self) -> str:
        key = f"{self.key}: " if self.key else ""
        return f"{self.where}: {key}{self.message}"

    def __reduce__(self):
        """Pickle by state, not by ``args``: subclasses (TraceFormatError) take other
        constructor arguments, and errors cross process pools (sweep, capacity, regress)."""
        return (_rebuild, (type(self), self.one_line(), self.__dict__))


def _rebuild(cls, text: str, state: dict) -> ConfigError:
    error = cls.__new__(cls)
    Exception.__init__(error, text)
    error.__dict__.update(state)
    return error
