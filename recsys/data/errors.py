"""The data error type (a leaf module: the config reads data sets' metadata too)."""


class DataError(ValueError):
    """Input data is missing or malformed; the message names the file (and line) at fault."""
