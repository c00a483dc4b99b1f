"""slimserve.estimator: images -> TFRecords -> input_fn -> fine-tuned slim ResNet."""
