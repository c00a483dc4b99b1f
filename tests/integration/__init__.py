"""The integration layer: in-process servers on loopback sockets, real TF graphs, short
trainings from a checkpoint, and child interpreters that probe our library under a limit
(memory, file size, a fresh import); never a command or a server run as its own process."""
