"""slimserve.serving: query TF Serving, or serve SavedModels without Docker.

Imports only TensorFlow, grpcio and the tensorflow-serving-api protos, never
estimator/: a server needs nothing but a SavedModel.
"""
