"""The bound of every number a TF Serving config file can hold, checked once, before the
config is used, with a message naming the file and the field.

A text-format file parses into TF Serving's (or TensorFlow's) message; `check(message,
where)` then walks every field it sets, down through sub-messages, maps and wrapper
values (`max_batch_size { value: 8 }`), and refuses the first number outside its rule as
a files.ConfigError: `--tensorflow_session_config_file s.config: session_inter_op_thread_pool
[0].num_threads must be in [0, 4096], got 100000`. RULES holds one rule per numeric field
of every config message, keyed by message type and field name (so TensorFlow's
ConfigProto is bounded the same inside a SessionBundleConfig as in its own file):

- a fields.Bound: the values accepted (NaN never passes a Bound);
- NOT_READ: a field this server does not read (a SessionBundleConfig field TF Serving
  uses for what is not served here); setting it is logged as having no effect, where the
  config is read;
- Refused(reason): a message this server does not take at all, whatever it holds;
- Delegated(checker): checked by the named component (BatchingParameters: by
  core/batching/parameters.py, which owns those rules);
- KeyedBound: a map's values bounded per key (device_count: at least one CPU).

tests/test_config_bounds.py walks every numeric field of every config message and fails
when one has no rule, throws 0, -1, 2^31, 2^63-1 and NaN at each, and checks
docs/reliability.md's bounds tables against `flags_table()` and `table()` (`python -m
slimserve.serving.config.bounds` prints them).
"""
import dataclasses
import math

from google.protobuf import descriptor

from slimserve import fields
from slimserve.serving import limits

_F = descriptor.FieldDescriptor
NUMERIC = frozenset((_F.TYPE_INT32, _F.TYPE_INT64, _F.TYPE_UINT32, _F.TYPE_UINT64,
                     _F.TYPE_SINT32, _F.TYPE_SINT64, _F.TYPE_FIXED32, _F.TYPE_FIXED64,
                     _F.TYPE_SFIXED32, _F.TYPE_SFIXED64, _F.TYPE_FLOAT, _F.TYPE_DOUBLE))
WRAPPERS = frozenset("google.protobuf.%sValue" % kind for kind in (
    "Int64", "UInt64", "Int32", "UInt32", "Float", "Double"))


class _Marker:
    def __init__(self, rule):
        self.rule = rule

    def __repr__(self):
        return self.rule


NOT_READ = _Marker("not read here (a value set is logged as having no effect)")


@dataclasses.dataclass(frozen=True)
class Refused:
    """A message type this server refuses wherever it appears."""
    reason: str

    @property
    def rule(self):
        return "refused: " + self.reason


@dataclasses.dataclass(frozen=True)
class Delegated:
    """A message checked by its own component."""
    checker: str

    @property
    def rule(self):
        return "checked by " + self.checker


@dataclasses.dataclass(frozen=True)
class KeyedBound:
    """A map's values bounded per key: `keys` {key: Bound}, `other` for the rest."""
    keys: tuple  # ((key, Bound), ...)
    other: fields.Bound

    def bound_for(self, key):
        return dict(self.keys).get(key, self.other)

    @property
    def rule(self):
        return "; ".join(["%s: %s" % (key, bound.rule) for key, bound in self.keys] +
                         ["others: %s" % self.other.rule])


_INT32 = fields.Bound(-2 ** 31, 2 ** 31 - 1)
_COUNT = fields.Bound(0, 2 ** 31 - 1)  # a step or chunk count: no allocation follows it
_THREADS = limits.THREADS_OR_ZERO  # 0: TensorFlow's default (one per core)
_BYTES = fields.Bound(0, limits.MAX_BYTES)
_MS = fields.Bound(0, limits.DAY_MS)  # 0: no timeout
_MB = fields.Bound(0.0, float(limits.MAX_BYTES >> 20))
_FRACTION = fields.Bound(0.0, 1.0)
_VERSION = fields.Bound(0, fields.INT64_MAX)  # version numbers are folder names: >= 0

RULES = {
    # --- TensorFlow's ConfigProto (--tensorflow_session_config_file; the session_config
    # of a platform config). Each model session is made from it: thread counts start
    # threads, device counts make devices, byte counts size buffers.
    "tensorflow.ConfigProto": {
        # every model op needs a CPU device: 0 of them fails every load
        "device_count": KeyedBound((("CPU", fields.Bound(1, limits.MAX_DEVICES)),),
                                   fields.Bound(0, limits.MAX_DEVICES)),
        "intra_op_parallelism_threads": _THREADS,
        # negative: run every op in the caller's thread (TensorFlow's meaning)
        "inter_op_parallelism_threads": fields.Bound(-1, limits.MAX_THREADS),
        "placement_period": _COUNT,
        "operation_timeout_in_ms": _MS,
    },
    "tensorflow.ThreadPoolOptionProto": {"num_threads": _THREADS},
    "tensorflow.GPUOptions": {
        # above 1: unified memory on a GPU (TensorFlow's meaning); no GPU serves here
        "per_process_gpu_memory_fraction": fields.Bound(0.0, 16.0),
        "deferred_deletion_bytes": _BYTES,
        "polling_active_delay_usecs": fields.Bound(0, limits.DAY_MICROS // 1000),
        "polling_inactive_delay_msecs": fields.Bound(0, limits.DAY_MS // 1000),
    },
    "tensorflow.GPUOptions.Experimental": {
        "num_virtual_devices_per_gpu": fields.Bound(0, limits.MAX_DEVICES),
        "num_dev_to_dev_copy_streams": fields.Bound(0, 64),
        "kernel_tracker_max_interval": _COUNT,
        "kernel_tracker_max_bytes": fields.Bound(0, 2 ** 31 - 1),
        "kernel_tracker_max_pending": _COUNT,
        "internal_fragmentation_fraction": _FRACTION,
        "gpu_host_mem_limit_in_mb": _MB,
        "gpu_system_memory_size_in_mb": fields.Bound(0, 2 ** 31 - 1),
    },
    "tensorflow.GPUOptions.Experimental.VirtualDevices": {
        "memory_limit_mb": _MB,
        "priority": _INT32,
        "device_ordinal": fields.Bound(0, limits.MAX_DEVICES),
    },
    "tensorflow.OptimizerOptions": {"max_folded_constant_in_bytes": _BYTES},
    "tensorflow.GraphOptions": {
        "build_cost_model": _COUNT, "build_cost_model_after": _COUNT,
        "timeline_step": _COUNT,
    },
    "tensorflow.RewriterConfig": {
        "min_graph_nodes": fields.Bound(-1, 2 ** 31 - 1),  # -1: always optimize
        "meta_optimizer_timeout_ms": fields.Bound(-1, limits.DAY_MS),  # <= 0: none
    },
    "tensorflow.RewriterConfig.CustomGraphOptimizer": Refused(
        "custom graph optimizers take opaque parameters no bound could check"),
    # each replica is a copy of the graph
    "tensorflow.AutoParallelOptions": {"num_replicas": fields.Bound(0, limits.MAX_REPLICAS)},
    "tensorflow.VerifierConfig": {"verification_timeout_in_ms": _MS},
    "tensorflow.RPCOptions": {
        "compression_level": fields.Bound(0, 9),  # zlib's levels
        "num_channels_per_target": fields.Bound(0, limits.MAX_DEVICES),
    },
    "tensorflow.JobDef": {"tasks": fields.Bound(0, 2 ** 31 - 1)},  # task indices
    "tensorflow.ConfigProto.Experimental": {
        "recv_buf_max_chunk": fields.Bound(0, 2 ** 31 - 1),
        "xla_fusion_autotuner_thresh": _COUNT,
    },
    # TensorFlow allows one session per (name, version) in a process: one set in the
    # shared session config fails the load of the second version or model
    "tensorflow.SessionMetadata": Refused(
        "every model session would share it, and TensorFlow refuses the second one"),
    "tensorflow.CoordinationServiceConfig": {
        "cluster_register_timeout_in_ms": _MS, "heartbeat_timeout_in_ms": _MS,
        "shutdown_barrier_timeout_in_ms": _MS,
    },
    "tensorflow.CoordinatedJob": {"num_tasks": fields.Bound(0, 2 ** 20)},
    # --- TF Serving's ModelServerConfig (--model_config_file, ReloadConfigRequest)
    "tensorflow.serving.FileSystemStoragePathSourceConfig.ServableVersionPolicy.Latest": {
        # 0: one, as TF Serving reads it; each version kept is a loaded model
        "num_versions": fields.Bound(0, limits.MAX_VERSIONS),
    },
    "tensorflow.serving.FileSystemStoragePathSourceConfig.ServableVersionPolicy.Specific": {
        "versions": _VERSION,
    },
    "tensorflow.serving.ModelConfig": {"version_labels": _VERSION},
    "tensorflow.serving.SamplingConfig": {
        "sampling_rate": _FRACTION,
        "attributes": NOT_READ,
    },
    # --- TF Serving's SessionBundleConfig (--platform_config_file)
    "tensorflow.serving.SessionBundleConfig": {
        "session_run_load_threadpool_index": NOT_READ,
        "experimental_transient_ram_bytes_during_load": NOT_READ,
        "experimental_fixed_input_tensors": NOT_READ,
        "num_tflite_interpreters": NOT_READ,
        "num_tflite_interpreters_per_pool": NOT_READ,
        "num_tflite_pools": NOT_READ,
    },
    "tensorflow.serving.ModelWarmupOptions": {
        # used only when > 0 (else once), as TF Serving's saved_model_warmup_util.cc
        "num_request_iterations": fields.Bound(-2 ** 31, limits.MAX_WARMUP_ITERATIONS),
        "num_model_warmup_threads": NOT_READ,
        "model_version": NOT_READ,
    },
    "tensorflow.serving.BatchingParameters": Delegated(
        "core/batching/parameters.py (BatchingParameters.check)"),
}

def roots():
    """[(flag, message descriptor)] of every text-format config file the server reads."""
    from tensorflow.core.protobuf import config_pb2  # pylint: disable=import-outside-toplevel
    from tensorflow_serving.config import model_server_config_pb2  # pylint: disable=import-outside-toplevel
    from slimserve.serving.config import messages  # pylint: disable=import-outside-toplevel
    return [("--model_config_file", model_server_config_pb2.ModelServerConfig.DESCRIPTOR),
            ("--tensorflow_session_config_file", config_pb2.ConfigProto.DESCRIPTOR),
            ("--platform_config_file", messages.SessionBundleConfig.DESCRIPTOR),
            ("--thread_pool_factory_config_file",
             config_pb2.ThreadPoolOptionProto.DESCRIPTOR),
            ("--batching_parameters_file", messages.BatchingParameters.DESCRIPTOR),
            ("--monitoring_config_file", messages.MonitoringConfig.DESCRIPTOR),
            ("--ssl_config_file", messages.SSLConfig.DESCRIPTOR)]


def _rule(message_type, field_name):
    rules = RULES.get(message_type)
    if isinstance(rules, dict):
        return rules.get(field_name)
    return None


def _value_field(field):
    """The field holding the number of a numeric, wrapper or map-of-numbers field, or
    None when `field` holds no number directly."""
    if field.type in NUMERIC:
        return field
    if field.type == _F.TYPE_MESSAGE:
        message = field.message_type
        if message.full_name in WRAPPERS:
            return message.fields_by_name["value"]
        if message.GetOptions().map_entry:
            value = message.fields_by_name["value"]
            if value.type in NUMERIC:
                return value
            key = message.fields_by_name["key"]
            if key.type in NUMERIC:
                return key
    return None


def _violation(rule, value, key=None):
    if isinstance(rule, KeyedBound):
        rule = rule.bound_for(key)
    if isinstance(rule, fields.Bound):
        if isinstance(value, float) and math.isnan(value):
            return "must be %s, got nan" % rule.rule
        if not rule.accepts(value):
            return "must be %s, got %r" % (rule.rule, value)
    return None


def check(message, where, unread=None):
    """Raises files.ConfigError naming `where` and the field for the first number (or
    refused message) of `message` outside its rule; returns `message`. unread: a list
    the paths of NOT_READ fields set are appended to (for the caller's "no effect" log)."""
    from slimserve.serving.config import files  # pylint: disable=import-outside-toplevel
    problem = _first_problem(message, "", unread)
    if problem:
        raise files.ConfigError("%s: %s" % (where, problem))
    return message


def _first_problem(message, path, unread):
    full_name = message.DESCRIPTOR.full_name
    rules = RULES.get(full_name)
    if isinstance(rules, Refused):
        return "%s: %s" % (path.rstrip(".") or full_name, rules.rule)
    if isinstance(rules, Delegated):
        return None
    for field, value in message.ListFields():
        name = path + field.name
        rule = _rule(full_name, field.name)
        if rule is NOT_READ:
            if unread is not None:
                unread.append(name)
            continue
        is_map = field.type == _F.TYPE_MESSAGE and field.message_type.GetOptions().map_entry
        number = _value_field(field)
        if number is not None:
            if rule is None:
                return "%s is a number this server has no bound for; it is not taken" % name
            if is_map:
                items = [("%s[%r]" % (name, key), value[key] if number.name == "value"
                          else key, key) for key in value]
            elif field.label == _F.LABEL_REPEATED:
                items = [("%s[%d]" % (name, i), v, None) for i, v in enumerate(value)]
            elif field.type == _F.TYPE_MESSAGE:  # a wrapper
                items = [(name, value.value, None)]
            else:
                items = [(name, value, None)]
            for item_name, item, key in items:
                violation = _violation(rule, item, key)
                if violation:
                    return "%s %s" % (item_name, violation)
            continue
        if field.type != _F.TYPE_MESSAGE:
            continue
        if is_map:
            for key in value:
                problem = _first_problem(value[key], "%s[%r]." % (name, key), unread)
                if problem:
                    return problem
        elif field.label == _F.LABEL_REPEATED:
            for index, item in enumerate(value):
                problem = _first_problem(item, "%s[%d]." % (name, index), unread)
                if problem:
                    return problem
        else:
            problem = _first_problem(value, name + ".", unread)
            if problem:
                return problem
    return None


def numeric_fields(message_descriptor, path="", seen=None, stop_at=()):
    """[(path, message type, field name)] of every numeric field reachable from a message
    type (wrapper values and maps of numbers included), stopping at refused and delegated
    types and at NOT_READ fields: what must have a rule. stop_at: message types listed
    as one entry (field name "=" + the type) instead of walked."""
    seen = set() if seen is None else seen
    if message_descriptor.full_name in seen:
        return []
    seen = seen | {message_descriptor.full_name}
    own = RULES.get(message_descriptor.full_name)
    if isinstance(own, (Refused, Delegated)):
        return []
    found = []
    for field in message_descriptor.fields:
        rule = _rule(message_descriptor.full_name, field.name)
        if rule is NOT_READ:
            found.append((path + field.name, message_descriptor.full_name, field.name))
            continue
        if _value_field(field) is not None:
            found.append((path + field.name, message_descriptor.full_name, field.name))
            continue
        if field.type != _F.TYPE_MESSAGE:
            continue
        target = field.message_type
        if target.GetOptions().map_entry:
            value = target.fields_by_name["value"]
            if value.type == _F.TYPE_MESSAGE:
                found += numeric_fields(value.message_type, path + field.name + "[].", seen)
            continue
        sub = RULES.get(target.full_name)
        if isinstance(sub, (Refused, Delegated)):
            found.append((path + field.name, target.full_name, None))
            continue
        if target.full_name in stop_at:
            found.append((path + field.name, target.full_name, "=" + target.full_name))
            continue
        found += numeric_fields(target, path + field.name + ".", seen, stop_at)
    return found


def rule_of(message_type, field_name):
    """The rule text of one entry of numeric_fields()."""
    if field_name is None:
        return RULES[message_type].rule
    if field_name.startswith("="):
        flag = next(flag for flag, root in roots() if root.full_name == field_name[1:])
        return "every field as in `%s`" % flag
    rule = _rule(message_type, field_name)
    if rule is None:
        return None
    return rule.rule


def table():
    """docs/reliability.md's table of config-file bounds: markdown rows `| file | field |
    bound |`, every numeric field of every config file."""
    rows = ["| file | field | accepted |", "| --- | --- | --- |"]
    for flag, root in roots():
        own = RULES.get(root.full_name)
        if isinstance(own, (Refused, Delegated)):
            rows.append("| `%s` | every field | %s |" % (flag, own.rule))
            continue
        found = numeric_fields(root, stop_at=("tensorflow.ConfigProto",)
                               if root.full_name != "tensorflow.ConfigProto" else ())
        if not found:
            rows.append("| `%s` | (no numeric field) | |" % flag)
        for path, message_type, field_name in found:
            rows.append("| `%s` | `%s` | %s |" % (flag, path, rule_of(message_type,
                                                                       field_name)))
    return "\n".join(rows) + "\n"


def flags_table():
    """docs/reliability.md's table of the server's numeric flags and their bounds (the
    option objects' fields, slimserve/fields.py)."""
    from slimserve.serving import options  # pylint: disable=import-outside-toplevel
    rows = ["| flag | accepted |", "| --- | --- |"]
    rows += ["| `--%s` | %s |" % row for row in fields.bounds_table(options.ServerOptions)]
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(flags_table())
    print(table(), end="")
