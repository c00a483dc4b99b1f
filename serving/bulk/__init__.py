"""Bulk inference: a folder, CSV or TFRecord split through one model, in this process or on Beam, into predictions and a report."""
