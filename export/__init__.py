"""slimserve.export: checkpoints -> SavedModels that TensorFlow Serving loads unchanged."""
