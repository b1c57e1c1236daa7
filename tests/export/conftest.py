"""Fixtures shared by the export checks."""

from .verl_checks import verl_env  # noqa: F401 - a fixture for the test modules here
