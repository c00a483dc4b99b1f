"""slimserve.flywheel: the served model's data loop as a library. Request logs the server
wrote are read back (serving.observability's one reader), tested for drift against the
reference the export recorded, and the images most worth a person's minute are proposed
(candidates), labelled, merged into the data set, retrained from, compared or canaried,
and published; each step is a module with a typed config and run(). It builds on
estimator/, export/ and serving/ and may import all three; none of them imports it, and
only commands (slimserve/cli), tests, benchmarks and scripts do (tests/unit/test_import_rule.py)."""
