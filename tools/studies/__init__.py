"""See README.md beside this file."""
