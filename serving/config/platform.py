"""How every TensorFlow model is loaded: TF Serving's SessionBundleConfig, taken from
--platform_config_file when given (a PlatformConfigMap whose "tensorflow" platform packs
a SavedModelBundleSourceAdapterConfig, the file TF Serving's own
CreateTensorFlowPlatformConfigMap writes), else composed from the flags exactly as
Server::BuildAndStart composes it (model_servers/server.cc). With a platform config file
TF Serving ignores the flags it would otherwise compose (batching, session config and
thread counts, tags, warmup, mixed precision); so does this server, and says so.

    settings = platform.bundle_settings(options)
    settings.session_config, settings.batching, settings.enable_model_warmup, ...
"""
import dataclasses
import logging
import typing

from slimserve.serving.config import bounds
from slimserve.serving.config import files
from slimserve.serving.config import messages
from slimserve.serving.config import session as session_lib
from slimserve.serving.core import batching as batching_lib

TENSORFLOW = "tensorflow"  # the model_platform of every model here
SOURCE_ADAPTER = messages.SavedModelBundleSourceAdapterConfig.DESCRIPTOR.full_name
# Flags a platform config file replaces (TF Serving reads them only without one).
REPLACED_FLAGS = ("enable_batching", "batching_parameters_file",
                  "enable_per_model_batching_parameters", "tensorflow_session_config_file",
                  "per_process_gpu_memory_fraction", "tensorflow_session_parallelism",
                  "tensorflow_intra_op_parallelism", "tensorflow_inter_op_parallelism",
                  "saved_model_tags", "enable_model_warmup",
                  "num_request_iterations_for_warmup", "mixed_precision",
                  "remove_unused_fields_from_bundle_metagraph", "prefer_tflite_model",
                  "num_tflite_pools", "num_tflite_interpreters_per_pool")
# SessionBundleConfig fields this server reads; any other field set is logged as having
# no effect here.
READ_FIELDS = ("session_config", "batching_parameters", "saved_model_tags",
               "enable_model_warmup", "model_warmup_options",
               "enable_per_model_batching_params", "mixed_precision")


@dataclasses.dataclass
class BundleSettings:
    """What a SessionBundleConfig decides, in the form the server wires up."""
    session_config: typing.Any  # tf.compat.v1.ConfigProto, before precision and XLA
    batching: typing.Any = None  # core.batching.BatchingParameters, or None: off
    per_model_batching: bool = False  # a version's batching_params.pbtxt replaces it
    saved_model_tags: typing.Any = None  # tuple of tags, or None: serve
    enable_model_warmup: bool = True
    warmup_iterations: int = 1  # times each warmup record is replayed
    mixed_precision: str = ""
    bundle: typing.Any = None  # the messages.SessionBundleConfig itself
    source: str = "the command-line flags"


def bundle_settings(options):
    """ServerOptions -> BundleSettings; files.ConfigError (naming the flag and file) when the
    platform config is malformed or asks for what cannot be served here."""
    if options.platform_config is not None or options.platform_config_file:
        if options.platform_config is not None:
            config_map, where = options.platform_config, "platform_config"
        else:
            config_map = files.read_platform_config(options.platform_config_file)
            where = "--platform_config_file %s" % options.platform_config_file
        ignored = [name for name in REPLACED_FLAGS
                   if getattr(options, name) != _default(name)]
        if options.batching_parameters is not None or options.session_config is not None:
            ignored.append("batching_parameters/session_config (in process)")
        if ignored:
            logging.warning("%s is given, so (as in TF Serving) these flags have no effect: "
                            "%s", where, ", ".join("--" + n for n in ignored))
        return from_platform_config(config_map, where)
    return from_flags(options)


def _default(name):
    from slimserve.serving import options as options_lib  # pylint: disable=import-outside-toplevel
    return options_lib.ServerOptions.__dataclass_fields__[name].default


def from_flags(options):
    """The settings the flags compose (what TF Serving puts in its SessionBundleConfig
    without a platform config file). --enable_batching without a parameters file is the
    adaptive scheduler (core/adaptive.py): the same answers as TF Serving's defaults,
    batch sizes and timing chosen from what it measures."""
    batching = None
    if options.batching_parameters is not None:
        options.batching_parameters.check("batching_parameters")
        batching = options.batching_parameters
    elif options.enable_batching:
        batching = (batching_lib.BatchingParameters.from_file(options.batching_parameters_file)
                    if options.batching_parameters_file
                    else batching_lib.BatchingParameters.adaptive_defaults(
                        source="--enable_batching (adaptive)"))
    tags = tuple(t for t in options.saved_model_tags.split(",") if t) or None
    return BundleSettings(
        session_config=session_lib.base_session_config(options), batching=batching,
        per_model_batching=bool(batching and options.enable_per_model_batching_parameters),
        saved_model_tags=tags, enable_model_warmup=options.enable_model_warmup,
        warmup_iterations=max(options.num_request_iterations_for_warmup, 1),
        mixed_precision=options.mixed_precision)


def from_platform_config(config_map, where="--platform_config_file"):
    """A PlatformConfigMap -> BundleSettings of its "tensorflow" platform."""
    unknown = sorted(set(config_map.platform_configs) - {TENSORFLOW})
    if unknown:
        raise files.ConfigError("%s: platform %s has no source adapter here: every model is a "
                         "TensorFlow SavedModel (platform %r)" % (where, ", ".join(
                             repr(name) for name in unknown), TENSORFLOW))
    if TENSORFLOW not in config_map.platform_configs:
        raise files.ConfigError("%s: no %r platform in platform_configs, so no model could load"
                         % (where, TENSORFLOW))
    packed = config_map.platform_configs[TENSORFLOW].source_adapter_config
    adapter = messages.SavedModelBundleSourceAdapterConfig()
    if not packed.Unpack(adapter):
        raise files.ConfigError("%s: platform %r: source_adapter_config must hold a %s, not %r"
                         % (where, TENSORFLOW, SOURCE_ADAPTER, packed.type_url or "nothing"))
    bundle = adapter.legacy_config
    bounds.check(bundle, '%s: platform_configs["%s"].source_adapter_config.legacy_config'
                 % (where, TENSORFLOW))
    if bundle.session_target:
        raise files.ConfigError("%s: session_target %r: only the local TensorFlow runtime "
                         "(session_target \"\") serves here" % (where, bundle.session_target))
    unused = sorted(field.name for field, _ in bundle.ListFields()
                    if field.name not in READ_FIELDS)
    if unused:
        logging.warning("%s: %s have no effect here", where, ", ".join(unused))
    batching = None
    if bundle.HasField("batching_parameters"):
        batching = batching_lib.BatchingParameters.from_proto(
            bundle.batching_parameters, "%s: batching_parameters" % where)
    warmup = bundle.model_warmup_options
    return BundleSettings(
        session_config=messages.tensorflow_config(bundle.session_config),
        batching=batching,
        per_model_batching=bool(batching and bundle.enable_per_model_batching_params),
        saved_model_tags=tuple(bundle.saved_model_tags) or None,
        enable_model_warmup=bundle.enable_model_warmup,
        warmup_iterations=max(warmup.num_request_iterations.value, 1)
        if warmup.HasField("num_request_iterations") else 1,
        mixed_precision=bundle.mixed_precision, bundle=bundle,
        source=where)


def platform_config_map(bundle):
    """A SessionBundleConfig as the PlatformConfigMap TF Serving builds from it
    (platform_config_util.cc's CreateTensorFlowPlatformConfigMap): what a
    --platform_config_file holds."""
    config_map = messages.PlatformConfigMap()
    config_map.platform_configs[TENSORFLOW].source_adapter_config.Pack(
        messages.SavedModelBundleSourceAdapterConfig(legacy_config=bundle))
    return config_map


def to_text(config_map):
    """A PlatformConfigMap in text format, Any values expanded, as a file holds it."""
    from google.protobuf import text_format  # pylint: disable=import-outside-toplevel
    return text_format.MessageToString(config_map, descriptor_pool=messages.POOL)

