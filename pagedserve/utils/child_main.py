"""Entry module of a ChildProcess (see child_process.py): `python -m pagedserve.utils.child_main FD NAME`.
Reads the pickled `(target, args)` from the socket FD and runs `target(conn, *args)`; a target may end by
running the next one its parent sends (`run_next_target`)."""

import pickle
import sys
from multiprocessing.connection import Connection


def run_next_target(conn: Connection) -> None:
    """Run the next `(target, args)` the parent sends; return at once if it closes the connection instead."""
    try:
        message = conn.recv_bytes()
    except EOFError:
        return
    target, args = pickle.loads(message)
    target(conn, *args)


def main() -> None:
    run_next_target(Connection(int(sys.argv[1])))


if __name__ == "__main__":
    main()
