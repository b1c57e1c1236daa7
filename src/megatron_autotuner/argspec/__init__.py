"""argparse pieces every command line of the tool shares: the `mat` CLI and the standalone
`python -m megatron_autotuner.validate`. Parse-time validators (`argtypes`), the help formatter (`help_format`)
and option groups two entry points define alike (`common`). Imports nothing heavier than argparse and specs."""
