"""What the tests and the benchmarks share: small real SavedModels (tiny_models,
half_plus_two, tflite_models, and any graph through saved_models), slim-format
"pretrained" checkpoints, image bombs, in-process and child-process servers with the
suite's memory caps, and the waits and teardowns around them.

Installed with the package, so benchmarks import it instead of the tests/ folder. Nothing
here is used by a command or a library."""
