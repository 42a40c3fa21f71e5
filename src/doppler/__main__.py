"""``python -m doppler``: the command-line tool (same as the ``doppler`` command)."""

from doppler.cli import main

if __name__ == "__main__":
    main()
