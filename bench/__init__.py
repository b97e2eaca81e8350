"""bench: the RL sanity test harness."""
__version__ = "0.1.0"
