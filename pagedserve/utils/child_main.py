"""Entry module of a ChildProcess (see child_process.py): `python -m pagedserve.utils.child_main FD NAME`.
Reads the pickled `(target, args)` from the socket FD and runs `target(conn, *args)`."""

import pickle
import sys
from multiprocessing.connection import Connection


def main() -> None:
    conn = Connection(int(sys.argv[1]))
    target, args = pickle.loads(conn.recv_bytes())
    target(conn, *args)


if __name__ == "__main__":
    main()
