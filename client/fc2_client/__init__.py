"""The `fc2` command-line client of the FC² platform's jobs API (docs/API.md): standard library only, so that it
installs on a researcher's own machine with nothing but Python."""

__version__ = "0.2.0"
