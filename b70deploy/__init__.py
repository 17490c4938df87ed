"""b70deploy: health-gated switch and one-command rollback for vLLM Compose stacks."""

__version__ = "0.1.0"
