"""Algorithms, the native trainer, stop rules and evaluation."""
