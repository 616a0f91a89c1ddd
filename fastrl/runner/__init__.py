"""The main process: spawns and watches the workers, reports progress, stops the run cleanly."""
