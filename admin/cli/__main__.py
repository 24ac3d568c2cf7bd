"""`python -m admin.cli`, the same as the `lembra` command."""

from admin.cli import main

main()
