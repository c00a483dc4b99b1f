"""Checks a freshly written SavedModel before it is published.

Loads it exactly as the server will (serving's `Servable`: the `serve` tag, the
signatures, the warmup replay) and checks each signature's method, inputs and outputs,
that every warmup request runs, and, when given, that its probabilities equal
`estimator.predict`'s on real images (max |dp| < tolerance).
"""
import numpy as np

from slimserve.export import signatures
from slimserve.serving.core import errors
from slimserve.serving.core import servable as servable_lib


class ExportVerificationError(RuntimeError):
    """The export does not match what was trained; it is not published."""


def _check_signatures(found, export_dir):
    for name, (method, inputs, outputs) in signatures.EXPECTED.items():
        if name not in found:
            raise ExportVerificationError("%s: signature %r missing (has %s)"
                                          % (export_dir, name, sorted(found)))
        sig = found[name]
        if sig.method_name != method:
            raise ExportVerificationError("%s: signature %r has method %s, expected %s"
                                          % (export_dir, name, sig.method_name, method))
        if set(sig.inputs) != inputs or set(sig.outputs) != outputs:
            raise ExportVerificationError(
                "%s: signature %r has inputs %s outputs %s, expected %s / %s"
                % (export_dir, name, sorted(sig.inputs), sorted(sig.outputs),
                   sorted(inputs), sorted(outputs)))


def verify_export(export_dir, images=None, expected_probabilities=None, tolerance=1e-5):
    """Returns a small report; raises ExportVerificationError on any mismatch."""
    try:
        servable = servable_lib.Servable("verify", 0, export_dir)
    except Exception as error:  # pylint: disable=broad-except
        raise ExportVerificationError("%s: cannot load with tag 'serve': %s"
                                      % (export_dir, error)) from None
    try:
        _check_signatures(servable.signatures, export_dir)
        try:
            count = servable.warm_up()
        except servable_lib.WarmupError as error:
            raise ExportVerificationError(str(error)) from None
        if not count:
            raise ExportVerificationError("%s: no warmup requests" % export_dir)
        report = {"warmup_requests": count}
        if images is not None and expected_probabilities is not None:
            signature = servable.signatures[signatures.DEFAULT]
            try:
                got = servable.run(signature, {signatures.IMAGE_BYTES: np.array(
                    images, dtype=object)}, [signatures.PROBABILITIES])
            except errors.ServingError as error:
                raise ExportVerificationError("%s: %s" % (export_dir, error.message)) from None
            diff = float(np.max(np.abs(got[signatures.PROBABILITIES]
                                       - np.asarray(expected_probabilities))))
            report["max_abs_probability_diff"] = diff
            if not diff < tolerance:
                raise ExportVerificationError(
                    "%s: export probabilities differ from estimator.predict by %.3g "
                    "(tolerance %.1g) on %d images" % (export_dir, diff, tolerance, len(images)))
    finally:
        servable.retire()
    return report


def run_signature(session, meta_graph, name, feeds):
    """feeds: {input key: numpy array} -> {output key: numpy array}, for a SavedModel
    loaded with tf.compat.v1.saved_model.loader (tests and benchmarks that measure
    bare session.run)."""
    sig = meta_graph.signature_def[name]
    feed_dict = {sig.inputs[key].name: value for key, value in feeds.items()}
    keys = sorted(sig.outputs)
    values = session.run([sig.outputs[key].name for key in keys], feed_dict=feed_dict)
    return dict(zip(keys, values))
