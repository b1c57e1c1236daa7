"""Errors the tool raises for bad input; the CLI turns each into one line and exit code 2."""


class AutotunerError(Exception):
    """Base class of every user-facing error of megatron-autotuner."""


class ConfigError(AutotunerError, ValueError):
    """An invalid configuration value: names the field and the rule it breaks."""

    def __init__(self, field: str, rule: str):
        self.field = field
        self.rule = rule
        super().__init__(f"{field}: {rule}")


class SpecNotFoundError(AutotunerError, LookupError):
    """A model or hardware name that is neither a preset nor a readable file."""
