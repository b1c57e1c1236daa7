"""torchrun jobs and their workers, shared by testbench, validate and overlap: start a job in its own session
that dies with `mat`, watch it, time it out, kill it with every process below it; JSON-lines records that
survive a kill; a lock on an output folder. No torch here: workers import it themselves."""

from .lock import OutputLock
from .process import LaunchReport, descendant_pids, exit_with_owner, kill_job, start_job, watch_job
from .records import append_record, read_records

__all__ = [
    "LaunchReport",
    "OutputLock",
    "append_record",
    "descendant_pids",
    "exit_with_owner",
    "kill_job",
    "read_records",
    "start_job",
    "watch_job",
]
