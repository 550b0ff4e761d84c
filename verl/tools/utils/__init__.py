"""Tool helpers: the registry that builds tools from a YAML file."""
