"""Engines: one file per way of running the same problem."""
