"""``python -m gitxet`` is ``git-xet``."""

from gitxet.cli.entry import main

main()
