"""Measured search: Optuna trials of the bundled trainer on local ranks or SLURM."""
