"""rtj-worker: the entrypoint and reference training script that ResilientTrainingJob pods run."""
