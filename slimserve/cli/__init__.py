"""The commands (one module per console script, slimserve-convert ... slimserve-predict)
and the helpers they share (logs.py: quiet logging; beam.py: Beam options). Each command
module defines its absl flags at import and calls the library; library modules define none
and never import this package."""
# Before any library import: TensorFlow's start-up noise is filtered while it loads.
from slimserve.cli import logs  # noqa: E402  pylint: disable=wrong-import-position

logs.quiet_tensorflow()
