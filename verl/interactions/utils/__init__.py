"""Interaction helpers: the registry that builds interactions from a YAML file."""
