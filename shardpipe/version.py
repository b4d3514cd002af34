"""The package version, in one place (the manifest records it, the CLI prints it)."""

__version__ = "0.1.0"
