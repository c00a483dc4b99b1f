"""The commands (one module per console script, slimserve-convert ... slimserve-predict)
and the helpers they share (logs.py: quiet logging; beam.py: Beam options). A command
module built on a config class (slimserve/fields.py) exposes CONFIG and main(config, args)
and gets its flags from `logs.run(main, config=CONFIG)`; library modules define no flags
and never import this package."""
import os
import sys

# Before any library import: TensorFlow's start-up noise is filtered while it loads.
from slimserve import cpu  # noqa: E402  pylint: disable=wrong-import-position
from slimserve.cli import logs  # noqa: E402  pylint: disable=wrong-import-position

# Commands that import no library before main() and want to answer before TensorFlow has
# loaded (seconds): slimserve-client says "nothing is listening" first. logs.run still
# quiets TensorFlow before they import it. Named as a console script or as `python -m`.
_TENSORFLOW_LATER = ("slimserve-client", "slimserve.cli.client")


def _command():
    """The console script's name, or the module of `python -m` (argv[0] is "-m" while
    its packages import; sys.orig_argv, Python 3.10+, still has the module)."""
    original = list(getattr(sys, "orig_argv", []))
    if "-m" in original[:-1]:
        return original[original.index("-m") + 1]
    return os.path.basename(sys.argv[0]) if sys.argv else ""


# Commands whose weights never change after loading: oneDNN keeps each filter in its
# blocked layout instead of converting it at every run (slimserve/cpu.py).
_INFERENCE_ONLY = ("slimserve-server", "slimserve.cli.server", "slimserve-predict",
                   "slimserve.cli.predict")

if _command() in _INFERENCE_ONLY:
    cpu.assume_frozen_weights()
if _command() not in _TENSORFLOW_LATER:
    logs.quiet_tensorflow()
