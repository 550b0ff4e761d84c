"""Utilities shared across verl."""
