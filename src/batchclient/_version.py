"""The package version, in a module of its own so that any layer can name it (the remote
provider's ``User-Agent``) without importing the package's public surface."""

__version__ = "0.1.0"
