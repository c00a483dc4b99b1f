"""Server-side request batching like TF Serving's --enable_batching (its BatchingSession
over a SharedBatchScheduler, batching_session.cc and shared_batch_scheduler.h), plus an
adaptive mode that needs no parameters (core/adaptive.py).

Every (servable, signature, outputs, input dtypes and shapes past the batch dimension)
has its own queue of batches; the last batch of a queue is open and takes new requests
until it holds max_batch_size rows (max_execution_batch_size with
enable_large_batch_splitting). num_batch_threads threads, shared by every queue, take
schedulable batches round-robin, concatenate the requests along dimension 0 (padded up to
the next allowed_batch_sizes entry with copies of a real row, and, with
pad_variable_length_inputs, every dimension past the first padded to the batch's largest),
run them once and hand each request its rows. When a batch is schedulable:

- TF Serving's rule (a parameters file): when it is full, closed, or its oldest request
  has waited batch_timeout_micros (0: at once, when a thread is free);
- adaptive (--enable_batching without a file, or thread_pool_name "slimserve_adaptive"
  in a file): when the policy of core/adaptive.py says so, from the cost of each batch size
  and the load it has measured; batch_timeout_micros is then the longest a free thread
  ever holds rows back (the bound), and a batch may take part of the queued rows.

A queue holds at most max_enqueued_batches batches: past that a request is answered
UNAVAILABLE instead of growing memory. A request's deadline (core/deadlines.py) bounds its
wait: past it the request is answered DEADLINE_EXCEEDED and dropped from its batch, and a
batch runs with the latest deadline of its requests as RunOptions.timeout_in_ms.

It is the server's one scheduler: a TFLite model's interpreter pool batches through it too
(Batcher.submit with core/tflite_servable.py's scheduling_parameters), as TF Serving's
TfLiteSession reuses its BasicBatchScheduler.

Differences from TF Serving, on purpose: requests of different shapes never share a batch
without padding (TF Serving fails such a batch as a whole); when a batch fails with an
error that is not a deadline, its requests are re-run one by one, so one bad request does
not fail its batch-mates; every field has an upper bound (BatchingParameters.check).

One job per file:

    parameters.py  BatchingParameters (TF Serving's message, bounded), the adaptive
                   defaults, a version's own file (parameters_for_version)
    queue.py       one kind's queue of batches: cutting requests into pieces, deciding
                   when its first batch runs
    batcher.py     Batcher: the shared batch threads, running a batch and answering its
                   requests

Callers import the package (`from slimserve.serving.core import batching`) and use the
names below.
"""
from slimserve.serving.core.batching.batcher import Batcher  # noqa: F401
from slimserve.serving.core.batching.batcher import MAX_LEARNERS  # noqa: F401
from slimserve.serving.core.batching.batcher import MAX_THREAD_FAILURES  # noqa: F401
from slimserve.serving.core.batching.parameters import ADAPTIVE_BOUND_MICROS  # noqa: F401
from slimserve.serving.core.batching.parameters import ADAPTIVE_POOL  # noqa: F401
from slimserve.serving.core.batching.parameters import BatchingParameters  # noqa: F401
from slimserve.serving.core.batching.parameters import MAX_BATCH_SIZE  # noqa: F401
from slimserve.serving.core.batching.parameters import MAX_ENQUEUED_BATCHES  # noqa: F401
from slimserve.serving.core.batching.parameters import PER_MODEL_FILE  # noqa: F401
from slimserve.serving.core.batching.parameters import UNBATCHED  # noqa: F401
from slimserve.serving.core.batching.parameters import parameters_for_version  # noqa: F401
