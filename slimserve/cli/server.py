"""slimserve-server: the embedded TF-Serving-compatible model server (gRPC 8500, REST 8501).

Takes every one of tensorflow_model_server 2.15.1's flags, with the same meaning, so a
command line written for one runs the other:

    slimserve-server --port=8500 --rest_api_port=8501 --model_name=resnet \\
        --model_base_path=/models/resnet --enable_batching

The flags are the fields of serving/options.py's ServerOptions (same names, defaults, help
and bounds), generated from its config class (CONFIG), so this module only builds the
server and hands it to serving/lifetime.py, which serves until a signal (SIGTERM or
SIGINT: drain and stop; SIGUSR1: publish the open request log files now; SIGUSR2: check
the logged traffic's drift now). A shutdown is bounded: --shutdown_grace_seconds (5) for
the requests in flight, 20 s more to the process's end (past that, every thread's stack on
stderr and exit status 1). Flags about hardware or runtimes this server does not have are
accepted and logged once as having no effect. Unlike TF Serving it binds 127.0.0.1 unless
--bind_address says otherwise. A start-up problem the user can fix (a flag, a config
file, a port in use) is one line naming it, exit status 1.
"""
import dataclasses

from slimserve import fields
from slimserve.cli import logs
from slimserve.serving import lifetime
from slimserve.serving import options as options_lib
from slimserve.serving import server as server_lib

TF_SERVING_VERSION = "2.15.1"


@dataclasses.dataclass
class ServerCommand:
    """slimserve-server's command line: the server's options, plus --version."""
    server: options_lib.ServerOptions = fields.section(options_lib.ServerOptions)
    version: bool = fields.option(False, "Print the version and exit.")


CONFIG = ServerCommand


def version_text():
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    try:
        from importlib import metadata  # pylint: disable=import-outside-toplevel
        own = metadata.version("slimserve")
    except Exception:  # pylint: disable=broad-except
        own = "dev"
    return ("slimserve-server %s (TensorFlow ModelServer %s command line and APIs)\n"
            "TensorFlow Library: %s" % (own, TF_SERVING_VERSION, tf.__version__))


def main(config, args):
    del args  # tensorflow_model_server ignores positional arguments too
    if config.version:
        print(version_text(), flush=True)
        return
    lifetime.serve(server_lib.ModelServer(config.server),
                   config.server.shutdown_grace_seconds)


def run():
    logs.run(main, config=CONFIG)


if __name__ == "__main__":
    run()
