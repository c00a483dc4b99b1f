"""TF Serving's BatchingParameters (session_bundle_config.proto) as a typed, bounded
object: its defaults, the adaptive scheduler's, reading a parameters file (the server's or
a version's own), and the checks TF Serving makes when it builds a batching session. What
the batcher (batcher.py) and the server's flags (config/platform.py) take."""
import bisect
import dataclasses

from slimserve import errors as user_errors
from slimserve import fields
from slimserve.serving import limits
from slimserve.serving.config import files

# A version's own parameters, read with --enable_per_model_batching_parameters (TF
# Serving's kBatchingParamsFilename, under the version's assets.extra).
PER_MODEL_FILE = "assets.extra/batching_params.pbtxt"
# servable.batching_parameters for a version that is not batched (per-model parameters
# are on and the version has no file, as TF Serving then serves it unbatched).
UNBATCHED = "unbatched"
# The thread_pool_name that asks for the adaptive scheduler in a parameters file (a
# slimserve extension TF Serving's parser accepts: to it, it only names the pool).
ADAPTIVE_POOL = "slimserve_adaptive"
# The adaptive mode's bound on holding rows back (its batch_timeout_micros when a file
# does not set one), as long as the timeouts slimserve-tune picks for image models: one
# run at a time is only planned for batches that take less than it.
ADAPTIVE_BOUND_MICROS = 500 * 1000
# The largest batch (and allowed size, and queue length in batches): far above what one
# host batches, low enough that padding to it or counting it cannot run away.
MAX_BATCH_SIZE = 2 ** 20
MAX_ENQUEUED_BATCHES = 2 ** 20


def _field(default, help_text, bound=None):
    return fields.option(default, help_text, bound)


@dataclasses.dataclass
class BatchingParameters:
    """TF Serving's BatchingParameters (session_bundle_config.proto), field for field,
    each with a bound (`check`).

    The defaults are TF Serving's scheduler with the values docs/serving.md gives; a
    file's fields replace them one by one. `adaptive_defaults()` is what --enable_batching
    uses without --batching_parameters_file (core/adaptive.py). `source` names the flag
    and file the parameters came from, for errors."""
    max_batch_size: int = _field(32, "Largest batch, in rows; a larger request is "
                                 "INVALID_ARGUMENT.", fields.Bound(1, MAX_BATCH_SIZE))
    batch_timeout_micros: int = _field(
        0, "Longest wait of a batch's first request for the batch to fill (adaptive: the "
        "longest hold).", fields.Bound(0, limits.DAY_MICROS))
    max_enqueued_batches: int = _field(100, "Batches one queue holds; past it UNAVAILABLE.",
                                       fields.Bound(1, MAX_ENQUEUED_BATCHES))
    num_batch_threads: int = _field(1, "Threads running batches, shared by every model.",
                                    limits.THREADS)
    thread_pool_name: str = _field("model_server_batch_threads", "The pool's name; "
                                   "%s asks for the adaptive scheduler." % ADAPTIVE_POOL)
    allowed_batch_sizes: tuple = _field((), "Sizes a batch is padded up to.",
                                        fields.Bound(1, MAX_BATCH_SIZE))
    pad_variable_length_inputs: bool = _field(False, "Pad dimensions past the first.")
    enable_large_batch_splitting: bool = _field(False, "Split a request across batches.")
    max_execution_batch_size: int = _field(
        0, "Largest batch run with splitting (0: max_batch_size).",
        fields.Bound(0, MAX_BATCH_SIZE))
    source: str = dataclasses.field(default="batching parameters", compare=False)

    @classmethod
    def adaptive_defaults(cls, **changes):
        """The adaptive scheduler's parameters: batches of up to 32 rows, rows held at
        most ADAPTIVE_BOUND_MICROS, two batch threads (one batch fills while another
        runs), 100 batches per queue."""
        return cls(**dict(dict(batch_timeout_micros=ADAPTIVE_BOUND_MICROS,
                               num_batch_threads=2, thread_pool_name=ADAPTIVE_POOL),
                          **changes))

    @property
    def adaptive(self):
        return self.thread_pool_name == ADAPTIVE_POOL

    @classmethod
    def from_file(cls, path, flag="batching_parameters_file"):
        """TF Serving's text-format BatchingParameters file (read by config/files.py)."""
        return cls.from_proto(files.read_batching_parameters(path, flag),
                              "--%s %s" % (flag, path))

    @classmethod
    def from_proto(cls, proto, where="--batching_parameters_file"):
        """From TF Serving's BatchingParameters message: the fields it sets replace our
        defaults (the adaptive ones when it names the adaptive pool); `where` names the
        flag and file in errors."""
        asks_adaptive = proto.HasField("thread_pool_name") and \
            proto.thread_pool_name.value == ADAPTIVE_POOL
        params = cls.adaptive_defaults() if asks_adaptive else cls()
        params.source = where
        for field in dataclasses.fields(cls):
            if field.name == "source":
                continue
            if field.name == "allowed_batch_sizes":
                params.allowed_batch_sizes = tuple(int(s) for s in proto.allowed_batch_sizes)
            elif field.name == "pad_variable_length_inputs":
                params.pad_variable_length_inputs = proto.pad_variable_length_inputs
            elif proto.HasField(field.name):
                setattr(params, field.name, getattr(proto, field.name).value)
        if params.max_enqueued_batches == 0 and not params.enable_large_batch_splitting:
            params.max_enqueued_batches = 1  # as TF Serving rewrites it (AddQueue)
        params.check(where)
        return params

    @property
    def execution_batch_size(self):
        """The largest batch run: max_execution_batch_size with splitting, else
        max_batch_size (shared_batch_scheduler.h's GetMaxExecutionBatchSize)."""
        if self.enable_large_batch_splitting and self.max_execution_batch_size:
            return self.max_execution_batch_size
        return self.max_batch_size

    def check(self, where=None):
        """Refuses what TF Serving refuses when it builds the batching session, with its
        wording, then any field outside its bound (the table in docs/reliability.md),
        behind `where` (the flag and file at fault; default: `source`), as a
        files.ConfigError (a UserError); returns self."""
        where = where or self.source

        def fail(message):
            raise files.ConfigError("%s: %s" % (where, message))
        if self.max_batch_size < 1:
            fail("max_batch_size must be positive; was %d" % self.max_batch_size)
        if self.num_batch_threads < 1:
            fail("num_batch_threads must be positive; was %d" % self.num_batch_threads)
        if self.batch_timeout_micros < 0:
            fail("batch_timeout_micros must be non-negative; was %d"
                 % self.batch_timeout_micros)
        if self.max_enqueued_batches < 1:
            fail("max_enqueued_batches must be positive; was %d" % self.max_enqueued_batches)
        if self.max_execution_batch_size < 0:
            fail("max_execution_batch_size must be positive; was %d"
                 % self.max_execution_batch_size)
        try:
            fields.check(self, where)
        except user_errors.UserError as error:
            raise files.ConfigError(str(error)) from None
        if self.enable_large_batch_splitting and \
                self.execution_batch_size > self.max_batch_size:
            fail("When enable_large_batch_splitting is true, input_batch_size_limit must be "
                 "greater than or equal to max_execution_batch_size (max_batch_size %d, "
                 "max_execution_batch_size %d)" % (self.max_batch_size,
                                                   self.execution_batch_size))
        sizes = self.allowed_batch_sizes
        if sizes:
            if any(s < 1 for s in sizes) or any(b <= a for a, b in zip(sizes, sizes[1:])):
                fail("allowed_batch_sizes entries must be positive and monotonically "
                     "increasing; got %s" % _shorten(sizes))
            if sizes[-1] != self.max_batch_size:
                fail("Last entry in allowed_batch_sizes must match max_batch_size; last "
                     "entry was %d; expected %d" % (sizes[-1], self.max_batch_size))
        return self

    def padded_size(self, rows):
        """The lowest allowed batch size >= rows (rows when none is, or none are given),
        as batching_util.cc's RoundToLowestAllowedBatchSize."""
        index = bisect.bisect_left(self.allowed_batch_sizes, rows)
        return self.allowed_batch_sizes[index] if index < len(self.allowed_batch_sizes) \
            else rows


def _shorten(values, most=8):
    values = list(values)
    return str(values) if len(values) <= most else "[%s, ... (%d entries)]" % (
        ", ".join(str(v) for v in values[:most]), len(values))


def parameters_for_version(version_dir, common, per_model):
    """The BatchingParameters a version is batched with: `common` (the server's; None:
    batching off), or with --enable_per_model_batching_parameters the version's own
    assets.extra/batching_params.pbtxt, whose fields replace the defaults (only
    num_batch_threads stays the server's: the batch threads are shared); UNBATCHED when
    that file is missing, as TF Serving then does not batch the version."""
    if common is None:
        return None
    if not per_model:
        return common
    import os  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    path = os.path.join(version_dir, PER_MODEL_FILE)
    if not tf.io.gfile.exists(path):
        return UNBATCHED
    params = BatchingParameters.from_file(path, "enable_per_model_batching_parameters")
    params.num_batch_threads = common.num_batch_threads
    return params
