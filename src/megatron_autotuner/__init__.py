"""megatron-autotuner: parallel-layout search, operator testbench and TP-overlap tuning for Megatron-Core."""

__version__ = "0.1.0"
SCHEMA_VERSION = 1
