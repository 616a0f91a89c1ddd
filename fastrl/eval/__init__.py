"""After training: play a run's checkpoint (`fastrl eval`) and draw its learning curves (`fastrl plot`)."""
