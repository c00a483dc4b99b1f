"""Readable logs for slimserve's commands: TensorFlow's start-up and deprecation noise
goes, real warnings stay.

Lives in slimserve/cli/, the command layer, because every command needs it and no
library may import it. Every command module calls `run(main)` from its `__main__` /
console-script entry: it quiets TensorFlow, makes `--help` list the command's own flags,
and keeps TensorFlow's INFO records behind `--verbosity=1`. Scripts that are not absl
commands call `quiet_tensorflow()` before anything imports tensorflow.
"""
import logging
import os
import sys
import tempfile
import warnings

from slimserve import errors

# C++ lines TF 2.15 prints at import on every CPU machine; none is actionable here.
_STARTUP_NOISE = (
    "Unable to register cuDNN factory", "Unable to register cuFFT factory",
    "Unable to register cuBLAS factory", "Could not find TensorRT",
    "cpu_feature_guard", "To enable the following instructions",
    "oneDNN custom operations are on", "rebuild TensorFlow with the appropriate",
    "Could not find cuda drivers", "successful NUMA node read",
)
# Python log records that announce API deprecations rather than problems.
_RECORD_NOISE = (
    "is deprecated", "Instructions for updating", "deprecated and will be removed",
    "Colocations handled automatically", "Use standard file APIs", "tf.keras.layers",
    "Use keras.layers", "non-resource variables are not supported",
    "Using temporary folder as model directory", "Scale of 0 disables regularizer",
)
# Estimator housekeeping printed around every train/eval call; progress.py and the
# eval results say what matters.
_HOUSEKEEPING = (
    "Calling model_fn.", "Done calling model_fn.", "Graph was finalized.",
    "Running local_init_op.", "Done running local_init_op.", "Calling checkpoint listeners",
    "Create CheckpointSaverHook.", "Not using Distribute Coordinator.",
    "Saving 'checkpoint_path' summary", "Assets added to graph.", "No assets to write.",
    "Signatures INCLUDED in export", "Signatures EXCLUDED from export",
)


class _DropNoise(logging.Filter):
    def filter(self, record):
        message = record.getMessage()
        return not any(noise in message for noise in _RECORD_NOISE + _HOUSEKEEPING)


def _import_tensorflow_filtering_stderr():
    """Imports TF with fd 2 captured, then replays every line that is not known noise."""
    if "tensorflow" in sys.modules:
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            import tensorflow  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            for line in captured.read().decode("utf-8", "replace").splitlines():
                if line.strip() and not any(noise in line for noise in _STARTUP_NOISE):
                    sys.stderr.write(line + "\n")


def quiet_tensorflow(verbosity=logging.INFO):
    """Hides TF's C++ INFO lines, start-up noise and deprecation notices."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    for category in (DeprecationWarning, FutureWarning, PendingDeprecationWarning):
        warnings.filterwarnings("ignore", category=category)
    warnings.filterwarnings("ignore", message=r".*`layer\.apply` is deprecated.*")
    warnings.filterwarnings("ignore", message=r".*is deprecated and will be removed.*")
    _import_tensorflow_filtering_stderr()
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    from tensorflow.python.util import deprecation  # pylint: disable=g-import-not-at-top
    deprecation._PRINT_DEPRECATION_WARNINGS = False  # pylint: disable=protected-access
    tf_logger = tf.get_logger()
    tf_logger.handlers = []  # absl's handler prints TF's records once, in absl's format
    tf_logger.addFilter(_DropNoise())
    tf_logger.setLevel(verbosity)
    logging.getLogger().setLevel(verbosity)
    logging.getLogger("absl").addFilter(_DropNoise())


# absl's own flags that every command's --help lists besides the command's own.
_SHARED_KEY_FLAGS = ("verbosity",)


def declare_command_flags(module_name):
    """Makes `--help` list the command's own flags.

    absl's --help shows the key flags of the module named by sys.argv[0]; a console
    script's argv[0] is its wrapper (`.venv/bin/slimserve-train`), which defines none, so
    --help said only "Try --helpfull". Every flag a slimserve module defined (the
    command's module and the shared helpers it imported, e.g. cli/beam.py) plus
    --verbosity become key flags of argv[0]. A flag another helper adds to any command
    module is covered without further wiring.
    """
    from absl import flags  # pylint: disable=g-import-not-at-top
    flag_values = flags.FLAGS
    main_module = sys.argv[0]
    for module, module_flags in flag_values.flags_by_module_dict().items():
        if module == main_module or not (module.startswith("slimserve")
                                         or module == module_name):
            continue
        for flag in module_flags:
            flag_values.register_key_flag_for_module(main_module, flag)
    for name in _SHARED_KEY_FLAGS:
        if name in flag_values:
            flag_values.register_key_flag_for_module(main_module, flag_values[name])
    main = sys.modules.get("__main__")
    command = sys.modules.get(module_name)
    if main is not None and command is not None and command is not main and not getattr(
            main, "__doc__", None):
        main.__doc__ = command.__doc__  # --help starts with the command's own usage text


def tensorflow_info_behind_verbosity():
    """TensorFlow's own INFO records (the RunConfig dump, "Saving checkpoints", "loss = ",
    "global_step/sec", evaluation start/finish) show only with --verbosity=1 or more;
    slimserve's own INFO lines (progress, evaluations, exports) stay at the default 0.
    `--logger_levels=tensorflow:INFO` also brings them back."""
    from absl import flags  # pylint: disable=g-import-not-at-top
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    flag_values = flags.FLAGS
    chosen = flag_values["logger_levels"].value if "logger_levels" in flag_values else None
    if "tensorflow" in (chosen or {}):
        return
    verbose = "verbosity" in flag_values and flag_values.verbosity >= 1
    tf.get_logger().setLevel(logging.DEBUG if verbose else logging.WARNING)


class _ConciseFormatter(logging.Formatter):
    """`21:53:49 step 51/300 ...`, `21:53:50 WARNING export/best: ...`: a console line a
    person reads, instead of absl's `I1123 21:53:49.632139 139916556258176 progress.py:44]`
    (kept at --verbosity=1, where thread ids and source lines help)."""

    def format(self, record):
        level = "" if record.levelno == logging.INFO else record.levelname + " "
        return "%s %s%s" % (self.formatTime(record, "%H:%M:%S"), level,
                            record.getMessage()) + (
                                "\n" + self.formatException(record.exc_info)
                                if record.exc_info else "")


def command_name(module_name):
    """slimserve.cli.tune_batching -> slimserve-tune-batching (the console script); under
    `python -m` the module is __main__ and its spec has the real name."""
    if module_name == "__main__":
        spec = getattr(sys.modules.get("__main__"), "__spec__", None)
        module_name = spec.name if spec is not None else os.path.basename(sys.argv[0])
    return "slimserve-" + module_name.rsplit(".", 1)[-1].replace("_", "-")


def call(name, main, *args):
    """Calls main(*args); a UserError becomes `sys.exit("<name>: <message>")` (exit
    status 1, one line), anything else keeps its traceback. Shared by `run` and the
    in-process command runner of the tests (slimserve/testing/commands.py)."""
    try:
        return main(*args)
    except errors.UserError as error:
        sys.exit("%s: %s" % (name, error))


def run(main, concise=False, config=None, module=None):
    """The entry point of every slimserve command: quiet TensorFlow, then absl's app.run;
    --help lists the command's own flags and TensorFlow's INFO records wait for
    --verbosity=1. `concise`: log lines with only the time (and the level unless INFO)
    below --verbosity=1.

    config: the command's config class (slimserve/fields.py): its flags are defined here,
    and main is called as main(config object, positional arguments) with the object built
    from the parsed flags and checked. Without it (older commands), the module defined its
    flags at import and main gets absl's argv. module: the command's module name (default
    main.__module__).

    A UserError (slimserve/errors.py) escaping `main` or the config's checks is printed
    as one line, `slimserve-<command>: <message>`, with exit status 1; any other exception
    keeps its traceback: it is a bug, not something the user can fix."""
    from absl import app  # pylint: disable=g-import-not-at-top
    from absl import flags  # pylint: disable=g-import-not-at-top
    from absl import logging as absl_logging  # pylint: disable=g-import-not-at-top
    from slimserve import fields  # pylint: disable=g-import-not-at-top
    module = module or main.__module__
    quiet_tensorflow()
    if config is not None:
        # Listed by --helpfull under the command's module (absl's name for __main__).
        fields.define_flags(config, module_name=sys.argv[0] if module == "__main__"
                            else module)
    declare_command_flags(module)
    name = command_name(module)

    def command_main(argv):
        tensorflow_info_behind_verbosity()
        if concise and flags.FLAGS.verbosity < 1:
            absl_logging.get_absl_handler().setFormatter(_ConciseFormatter())
        if config is None:
            return call(name, main, argv)
        return call(name, lambda: main(fields.from_flags(config), argv[1:]))

    app.run(command_main)
