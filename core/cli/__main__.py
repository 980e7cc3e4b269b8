"""``python -m mqstore.cli``: the same as the ``mqstore`` script."""

from mqstore.cli import main

main(prog_name="mqstore")
