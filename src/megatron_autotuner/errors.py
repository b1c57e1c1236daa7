"""Errors the tool raises for bad input; the CLI turns each into one line and exit code 2."""


class AutotunerError(Exception):
    """Base class of every user-facing error of megatron-autotuner: bad input, exit code 2."""

    exit_code = 2
    prefix = "error: "


class NothingMeasuredError(AutotunerError):
    """A measuring command ran (or could not start) and measured nothing, or every case failed: exit code 1,
    one line saying why (`mat: nothing measured: no CUDA GPU: 0 of 6 layouts ran`)."""

    exit_code = 1
    prefix = "nothing measured: "


class ConfigError(AutotunerError, ValueError):
    """An invalid configuration value: names the field and the rule it breaks."""

    def __init__(self, field: str, rule: str):
        self.field = field
        self.rule = rule
        super().__init__(f"{field}: {rule}")


class SpecNotFoundError(AutotunerError, LookupError):
    """A model or hardware name that is neither a preset nor a readable file."""


def reject_unknown_fields(cls: type, data: dict, what: str) -> None:
    """ConfigError naming the first key of `data` that dataclass `cls` has no field for, and the allowed ones."""
    import dataclasses

    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(unknown[0], f"is not a {what} field (allowed: {', '.join(sorted(known))})")
