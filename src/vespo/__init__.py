"""vespo: off-policy RL for LLMs with VESPO's sequence-level soft importance-weight kernel."""

__version__ = "0.1.0"
