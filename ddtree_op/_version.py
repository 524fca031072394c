# The package version, read by pyproject.toml (setuptools dynamic version) and exported as ddtree_op.__version__.
__version__ = "0.2.0"
