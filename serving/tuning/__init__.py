"""Tuning a server from outside: measure candidate settings (batching, threads, runtime, precision) against a real server and write the best."""
