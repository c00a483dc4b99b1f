"""slimserve: from a folder of labelled images to a fine-tuned TF-Slim ResNet served by
TensorFlow Serving.

One import name for the whole project. The three libraries live in the repository's
top-level folders and are installed under this package by setup.py:

    slimserve.estimator   images -> TFRecords -> a trained checkpoint (estimator/)
    slimserve.export      checkpoint -> a SavedModel TF Serving loads (export/)
    slimserve.serving     everything after a SavedModel exists (serving/)

`slimserve.cli` holds the commands (absl flags, logging set-up) above the libraries, and
`slimserve.conventions` the contract every package shares.
"""
