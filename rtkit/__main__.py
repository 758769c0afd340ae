# __main__.py -- `python -m rtkit` runs the CLI.
import sys

from rtkit.cli import main

sys.exit(main())
