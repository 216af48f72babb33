"""One module per kind of work item, so a stage depends (in dvc.yaml) only on its own."""
