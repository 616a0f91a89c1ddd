"""What a run leaves on disk: the run directory layout and atomic checkpoints."""

from fastrl.rundir.checkpoints import latest_checkpoint, load_checkpoint, save_checkpoint
from fastrl.rundir.layout import RunDirError, prepare_run_dir, write_json

__all__ = ["RunDirError", "latest_checkpoint", "load_checkpoint", "prepare_run_dir", "save_checkpoint", "write_json"]
