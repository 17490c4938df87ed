"""One module per verb: the logic behind a CLI command, callable without click."""
