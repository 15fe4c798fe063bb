"""``python -m gitxet`` is ``git-xet``."""

from gitxet.cli.app import main

main()
