"""The package version: the single place it is written."""

__version__ = "0.1.0.dev0"
