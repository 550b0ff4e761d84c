"""Algorithm recipes built on verl (run from a checkout: ``python -m recipe.<name>.main_<name>``; not installed)."""
