"""The unit layer (`make unit`, under a minute on 2 cores): pure functions and graphs run in
the test's own process; no child process, no socket, no training (InProcess wires the
REST routes and gRPC servicers without a socket)."""
