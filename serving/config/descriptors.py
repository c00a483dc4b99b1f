"""Protobuf message classes built from field lists, in a private descriptor pool: for the
.proto files TensorFlow Serving and TensorFlow define but no installed wheel ships Python
code for (TF Serving's config messages in config/messages.py, TensorFlow's
profiler_service.proto in api/profiler_service.py).

    pool, classes = descriptors.build(
        "slimserve/example.proto", "tensorflow.serving",
        {"Prometheus": [("enable", 1, BOOL, OPTIONAL, None),
                        ("labels", 2, MAP, ("string", ".google.protobuf.Any"), None)]},
        imports=(any_pb2.DESCRIPTOR,))

A field is (name, number, type, label, message type name or None), with protobuf's own
FieldDescriptorProto constants; a map field has MAP in the type's place and (key type
name, value message type) as its label (protobuf's encoding: a repeated nested
`<Name>Entry` message). The pool is private, so a future wheel that ships the same
messages cannot clash with these.
"""
from google.protobuf import descriptor_pb2
from google.protobuf import descriptor_pool
from google.protobuf import message_factory

F = descriptor_pb2.FieldDescriptorProto
OPTIONAL, REPEATED = F.LABEL_OPTIONAL, F.LABEL_REPEATED
MAP = "map"  # a map field: (key type name, value message type) in the label's place


def _add_file(pool, file_descriptor, added):
    """Copies a generated .proto file (and, first, its imports) into `pool`."""
    if file_descriptor.name in added:
        return
    for dependency in file_descriptor.dependencies:
        _add_file(pool, dependency, added)
    pool.Add(descriptor_pb2.FileDescriptorProto.FromString(file_descriptor.serialized_pb))
    added.add(file_descriptor.name)


def camel(name):
    """A field's JSON name, as protoc derives it: max_batch_size -> maxBatchSize."""
    head, *tail = name.split("_")
    return head + "".join(part.title() for part in tail)


def _add_message(message, package, name, fields):
    for field, number, kind, label, type_name in fields:
        if kind == MAP:
            key_type, value_type = label
            entry_name = "".join(part.title() for part in field.split("_")) + "Entry"
            entry = message.nested_type.add(name=entry_name)
            entry.options.map_entry = True
            entry.field.add(name="key", number=1, json_name="key", label=OPTIONAL,
                            type=getattr(F, "TYPE_" + key_type.upper()))
            entry.field.add(name="value", number=2, json_name="value", label=OPTIONAL,
                            type=F.TYPE_MESSAGE, type_name=value_type)
            kind, label, type_name = (F.TYPE_MESSAGE, REPEATED,
                                      ".%s.%s.%s" % (package, name, entry_name))
        added = message.field.add(name=field, number=number, type=kind, label=label,
                                  json_name=camel(field))
        if type_name:
            added.type_name = type_name


def build(file_name, package, messages, imports=()):
    """(pool, {name: message class}) for `messages` {name: [field, ...]} in package
    `package`, declared in one file `file_name` that imports `imports` (generated file
    descriptors, e.g. wrappers_pb2.DESCRIPTOR; their own imports are added too)."""
    pool = descriptor_pool.DescriptorPool()
    added = set()
    for file_descriptor in imports:
        _add_file(pool, file_descriptor, added)
    file_proto = descriptor_pb2.FileDescriptorProto(
        name=file_name, package=package, syntax="proto3",
        dependency=[f.name for f in imports])
    for name, fields in messages.items():
        _add_message(file_proto.message_type.add(name=name), package, name, fields)
    pool.Add(file_proto)
    return pool, {name: message_factory.GetMessageClass(
        pool.FindMessageTypeByName("%s.%s" % (package, name))) for name in messages}
