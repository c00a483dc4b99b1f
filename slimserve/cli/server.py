"""slimserve-server: the embedded TF-Serving-compatible model server (gRPC 8500, REST 8501).

Takes every one of tensorflow_model_server 2.15.1's flags, with the same meaning, so a
command line written for one runs the other:

    slimserve-server --port=8500 --rest_api_port=8501 --model_name=resnet \\
        --model_base_path=/models/resnet --enable_batching

The flags are the fields of serving/options.py's ServerOptions (same names, defaults and
help), so this module only parses them, builds the server and waits for a signal (SIGTERM
or SIGINT: drain and stop; SIGUSR1: publish the open request log files now). Flags
about hardware or runtimes this server does not have are accepted and logged once as
having no effect. Unlike TF Serving it binds 127.0.0.1 unless --bind_address says otherwise.
"""
import logging
import signal
import sys
import threading

from absl import flags

import tensorflow as tf

from slimserve.cli import logs
from slimserve.serving import options as options_lib
from slimserve.serving import server as server_lib
from slimserve.serving.core import errors

FLAGS = flags.FLAGS
TF_SERVING_VERSION = "2.15.1"
_DEFINE = {bool: flags.DEFINE_bool, int: flags.DEFINE_integer, float: flags.DEFINE_float,
           str: flags.DEFINE_string}


def _define_flags():
    for field in options_lib.flag_fields():
        help_text = field.metadata["help"]
        if field.metadata["slimserve_only"]:
            help_text += " (slimserve only)"
        kwargs = {}
        if field.metadata["lower_bound"] is not None:
            kwargs["lower_bound"] = field.metadata["lower_bound"]
        _DEFINE[field.type](field.name, field.default, help_text, **kwargs)


_define_flags()
flags.DEFINE_bool("version", False, "Print the version and exit.")


def version_text():
    try:
        from importlib import metadata  # pylint: disable=import-outside-toplevel
        own = metadata.version("slimserve")
    except Exception:  # pylint: disable=broad-except
        own = "dev"
    return ("slimserve-server %s (TensorFlow ModelServer %s command line and APIs)\n"
            "TensorFlow Library: %s" % (own, TF_SERVING_VERSION, tf.__version__))


def options_from_flags():
    """The parsed command line as a ServerOptions (field names are flag names)."""
    return options_lib.ServerOptions(**{field.name: FLAGS[field.name].value
                                        for field in options_lib.flag_fields()})


def main(argv):
    del argv
    if FLAGS.version:
        print(version_text(), flush=True)
        return
    try:
        server = server_lib.ModelServer(options_from_flags())
    except (ValueError, OSError) as error:
        sys.exit("slimserve-server: %s" % error)
    stopping = threading.Event()

    def on_signal(signum, frame):
        del frame
        logging.info("signal %d: shutting down gracefully", signum)
        stopping.set()

    def on_flush(signum, frame):
        del signum, frame
        logging.info("SIGUSR1: publishing the open request log files")
        server.flush_request_logs()  # queues a flush behind each logger's records

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGUSR1, on_flush)
    try:
        server.start()
    except errors.ServingError as error:  # e.g. a version label that names no version
        server.stop()
        sys.exit("slimserve-server: %s" % error.message)
    print(server_lib.ready_line(server), flush=True)
    stopping.wait()
    if server.stop():
        logging.info("stopped")
    else:
        logging.warning("stopped; some requests were still running after the grace period")


def run():
    logs.run(main)


if __name__ == "__main__":
    run()
