"""Serving-framework integrations; each submodule imports its framework, this package does not."""
