"""One thin command-line entry per DVC stage (dvc.yaml): parse args, load the params, call pipelines/ or wise/."""
