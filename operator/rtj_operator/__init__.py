"""rtj-operator: reconciles ResilientTrainingJobs into a headless Service, an Indexed Job and a PVC."""

__version__ = "0.1.0"
