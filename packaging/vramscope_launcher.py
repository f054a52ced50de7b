"""The bundle's entry point: lets a spawned engine process take its own path, then runs main.py's main()."""

import multiprocessing
import sys

if __name__ == "__main__":
    # The GUI's engine worker is a multiprocessing "spawn" child; in a frozen build it re-executes this program
    # with --multiprocessing-fork, and freeze_support() turns that run into the worker instead of a second app.
    multiprocessing.freeze_support()
    from main import main

    sys.exit(main())
