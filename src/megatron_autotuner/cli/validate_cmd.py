"""`mat validate`: real short megatron-core runs of layouts, measured vs predicted (see `validate.command`)."""

from ..validate.command import register, run

__all__ = ["register", "run"]
