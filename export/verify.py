"""Checks a freshly written SavedModel before it is published.

Loads it exactly as the server will (serving's `Servable`: the `serve` tag, the
signatures, the warmup replay) and checks each signature's method, inputs and outputs,
that every warmup request runs, and, when given, that its probabilities equal
`estimator.predict`'s on real images (max |dp| < tolerance) and that its `embeddings`
signature answers finite [N, D] features, the same for an image alone as in a batch. The same images then run
through the same signature with the server's --mixed_precision=bfloat16 session (the
oneDNN bfloat16 rewrite): their agreement with float32 and max |dp| are recorded next to
the float32 figures (informational: a low agreement does not stop the export, it tells
whether bfloat16 serving is safe for this model). The report is returned and written to
the version's assets.extra/export_verification.json.
"""
import json
import os

import numpy as np
import tensorflow as tf

from slimserve import compute
from slimserve import cpu
from slimserve import errors as user_errors
from slimserve.export import signatures
from slimserve.serving.core import errors
from slimserve.serving.core import servable as servable_lib

REPORT_FILE = "export_verification.json"  # under the version's assets.extra


class ExportVerificationError(user_errors.UserError):
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


def _probabilities(servable, images, export_dir):
    signature = servable.signatures[signatures.DEFAULT]
    try:
        return servable.run(signature, {signatures.IMAGE_BYTES: np.array(images, dtype=object)},
                            [signatures.PROBABILITIES])[signatures.PROBABILITIES]
    except errors.ServingError as error:
        raise ExportVerificationError("%s: %s" % (export_dir, error.message)) from None


def check_embeddings(servable, images, export_dir):
    """{"embedding_size"}: the `embeddings` signature answers [N, D] finite features for
    the N images, and the same features for an image alone as in the batch (what drift
    detection relies on: a served image's features do not depend on its batch)."""
    signature = servable.signatures[signatures.EMBEDDINGS_SIGNATURE]
    try:
        batch = servable.run(signature, {signatures.IMAGE_BYTES: np.array(images, dtype=object)},
                             [signatures.EMBEDDINGS])[signatures.EMBEDDINGS]
        alone = servable.run(signature, {signatures.IMAGE_BYTES: np.array(images[:1],
                                                                          dtype=object)},
                             [signatures.EMBEDDINGS])[signatures.EMBEDDINGS]
    except errors.ServingError as error:
        raise ExportVerificationError("%s: embeddings: %s" % (export_dir, error.message)) \
            from None
    if batch.ndim != 2 or batch.shape[0] != len(images) or not batch.shape[1] or \
            not np.all(np.isfinite(batch)):
        raise ExportVerificationError("%s: the embeddings signature answered %s for %d "
                                      "images, not finite [N, D] features"
                                      % (export_dir, batch.shape, len(images)))
    scale = max(1.0, float(np.max(np.abs(batch[0]))))
    if not np.allclose(alone[0], batch[0], rtol=1e-4, atol=1e-4 * scale):
        raise ExportVerificationError("%s: an image's embeddings differ alone and in a batch"
                                      % export_dir)
    return {"embedding_size": int(batch.shape[1])}


def bfloat16_parity(export_dir, images, reference):
    """{"bf16_argmax_agreement", "bf16_max_abs_probability_diff", "bf16_images"} of the
    export run as --mixed_precision=bfloat16 serves it, against `reference` (float32
    probabilities of the same images); {"bf16_unavailable": why} where this process
    cannot run the rewrite (compute.bfloat16_unavailable) or the CPU has no native
    bfloat16."""
    reason = compute.bfloat16_unavailable()
    if reason is None and cpu.cpu_supports_bf16() is False and not \
            tf.config.list_physical_devices("GPU"):
        # oneDNN would only emulate it (or fall back, logging an error line per session):
        # the figures would say nothing about bfloat16 serving on a CPU that has it
        reason = "this CPU has neither AVX512_BF16 nor AMX"
    if reason:
        return {"bf16_unavailable": reason}
    config = compute.enable_bfloat16(tf.compat.v1.ConfigProto(),
                                         "bfloat16 export parity")
    servable = servable_lib.Servable("verify-bf16", 0, export_dir, config)
    try:
        got = _probabilities(servable, images, export_dir)
    finally:
        servable.retire()
    reference = np.asarray(reference)
    return {"bf16_argmax_agreement": float(np.mean(got.argmax(1) == reference.argmax(1))),
            "bf16_max_abs_probability_diff": float(np.max(np.abs(got - reference))),
            "bf16_images": len(images)}


def verify_export(export_dir, images=None, expected_probabilities=None, tolerance=1e-5,
                  bfloat16=True):
    """Returns a small report (also written to assets.extra/export_verification.json);
    raises ExportVerificationError on any mismatch. bfloat16: also measure the bfloat16
    parity (module docstring) when images are given."""
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
            got = _probabilities(servable, images, export_dir)
            diff = float(np.max(np.abs(got - np.asarray(expected_probabilities))))
            report["max_abs_probability_diff"] = diff
            if not diff < tolerance:
                raise ExportVerificationError(
                    "%s: export probabilities differ from estimator.predict by %.3g "
                    "(tolerance %.1g) on %d images" % (export_dir, diff, tolerance, len(images)))
            report.update(check_embeddings(servable, images, export_dir))
            if bfloat16:
                report.update(bfloat16_parity(export_dir, images, expected_probabilities))
    finally:
        servable.retire()
    extra = os.path.join(export_dir, signatures.EXTRA_DIR)
    tf.io.gfile.makedirs(extra)
    with tf.io.gfile.GFile(os.path.join(extra, REPORT_FILE), "w") as handle:
        json.dump(report, handle, indent=1, sort_keys=True)
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
