"""Helpers shared by the worker engines (veRL's ``verl.workers.utils``)."""
