"""slimserve.serving: everything after a SavedModel exists.

    core/           servable, version policy and directories, model manager, batching,
                    the inference service (one signature lookup, one status per API),
                    tensor codecs, errors
    api/            gRPC servicer; REST routes and JSON; the waitress HTTP transport; TLS
    config/         the one reader of TF Serving's config files, their messages, the
                    served-model list, the session config, the config-file poller
    observability/  metrics, request logs (the one writer, the one reader, the object
                    owning every model's logger), the live drift check and its pipeline,
                    thumbnails, the last-minute request window, status page
    clients/        what talks to a running server: client, channel, load test, the
                    in-process image classifier, served accuracy
    bulk/           bulk inference over a folder, CSV or TFRecord split (local or Beam)
    tuning/         the tuner that measures server settings against real servers
    server.py       ModelServer(options): wiring only; options.py: the flags as one object;
                    limits.py: the bounds of every numeric setting; lifetime.py: a served
                    process from signal to exit; server_process.py: the one launcher of
                    `slimserve-server` children (tuner, tests, benchmarks)
    tfserving/ kubernetes/   files for the real tensorflow/serving and for clusters

Needs TensorFlow, grpcio, tensorflow-serving-api, waitress, prometheus_client and
slimserve.conventions (clients/, bulk/ and tuning/ also slimserve.outputs and
slimserve.errors); never imports slimserve.estimator, slimserve.export or
slimserve.flywheel: a server needs nothing but a SavedModel (tests/unit/test_import_rule.py).
"""
