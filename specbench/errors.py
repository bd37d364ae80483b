"""Errors caused by input or environment: the CLI reports them in one line, without a traceback."""


class UserError(Exception):
    """Base of every error the user can fix (bad setting, missing data or weights)."""


class ConfigError(UserError, ValueError):
    """A setting has an impossible value, or a prompt does not fit the model."""


class ModelUnavailable(UserError):
    """Weights cannot be found locally and the Hub cannot be reached."""


class DataUnavailable(UserError):
    """A dataset's records cannot be found locally and the Hub cannot be reached."""


class DataError(UserError):
    """A local data file is malformed: a line that is not JSON, a record missing a field, no records."""


class RunConflict(UserError):
    """The output directory holds results of a different configuration, or another process writes it."""


class StorageError(UserError):
    """A result could not be written (full disk, read-only folder): what was finished before is kept."""
