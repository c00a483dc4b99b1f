"""The system layer: our commands and servers run as their own processes, browsers, long
trainings, and everything that needs the suite's trained run (a slimserve-train process)."""
