"""The esbox command-line interface."""
