"""What a run leaves on disk: the run directory layout, atomic checkpoints, its records and the
recent episodes a resume carries on from."""

from fastrl.rundir.checkpoints import (CheckpointError, latest_checkpoint, load_checkpoint, remove_partial_files,
                                       save_checkpoint, validate_checkpoint)
from fastrl.rundir.layout import (RunDirError, abandon_fresh_run_dir, claim_run_dir, resolve_run_dir, write_json,
                                  write_run_config)

__all__ = ["CheckpointError", "RunDirError", "abandon_fresh_run_dir", "claim_run_dir", "latest_checkpoint",
           "load_checkpoint", "remove_partial_files", "resolve_run_dir", "save_checkpoint", "validate_checkpoint",
           "write_json", "write_run_config"]
