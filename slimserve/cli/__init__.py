"""The serving commands (slimserve-server, -client, -loadtest) and the quiet logging every
slimserve command shares. Each command module defines its absl flags at import and calls
the library; library modules define none."""
# Before any library import: TensorFlow's start-up noise is filtered while it loads.
from slimserve.cli import logs  # noqa: E402  pylint: disable=wrong-import-position

logs.quiet_tensorflow()
