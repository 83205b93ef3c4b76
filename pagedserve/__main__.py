"""`python -m pagedserve ...` runs the `pagedserve` command: scripts and benchmarks start the server with
`sys.executable -m pagedserve serve` and need no console script on PATH."""

import sys

from pagedserve.entrypoints.cli import main

if __name__ == "__main__":
    sys.exit(main())
