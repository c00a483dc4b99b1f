"""--mixed_precision=bfloat16 and --xla_cpu_compilation_enabled on the served model
sessions: bfloat16 really changes how the trained model computes yet agrees with float32
on the digits' validation images; XLA really compiles the served graph; every loaded
version says in the metrics what it runs in; export verification records the bfloat16
parity next to the float32 one."""
import json
import logging
import os

import numpy as np
import pytest
import tensorflow as tf

from slimserve import compute
from slimserve import cpu
from slimserve.estimator import schema
from slimserve.estimator import splits
from slimserve.export import signatures
from slimserve.export import verify
from slimserve.serving import options as options_lib
from slimserve.serving.clients import client as client_lib
from slimserve.serving.config import model_config
from slimserve.serving.config import session as session_lib
from slimserve.serving.core import servable as servable_lib
from slimserve.serving.observability import metrics
from slimserve.testing.servers import serve_in_process

# The session fixture's model trains 60 steps (~87% accurate): bfloat16's 8-bit mantissa
# moves probabilities by up to ~0.25, which flips a few of its many unsure answers
# (98.3-99.4% agreement measured over runs). Issue 22's 0.995 bound is for a trained model
# and is reported by the benchmark (bench_serve.py --sections limit, docs/benchmarks.md),
# not asserted here: a 300-step run in the suite cost two minutes and, training being
# nondeterministic on CPU, landed between 0.986 and 0.997 on the 359 validation digits.
MIN_AGREEMENT_60_STEPS = 0.95


def _served_probabilities(server, images):
    client = client_lib.Client("127.0.0.1:%d" % server.port, retries=0)
    try:
        return np.concatenate([client.predict({signatures.IMAGE_BYTES: images[i:i + 64]})[
            signatures.PROBABILITIES] for i in range(0, len(images), 64)])
    finally:
        client.close()


def _runtime_lines(server):
    return [line for line in server.metrics.render().splitlines()
            if line.startswith(metrics.MODEL_RUNTIME + "{")]


def _bfloat16_agreement(export_dir, digits_data):
    """Serves the export in float32 and in bfloat16 and sends every validation image to
    both -> (argmax agreement, max |dp|); checks each server's model_runtime metric."""
    images = splits.read_images(digits_data, schema.VALIDATION, 10000)[0]
    base = os.path.dirname(export_dir)
    served = {}
    for precision in ("", session_lib.BFLOAT16):
        server = serve_in_process([model_config.ServedModel("resnet", base)],
                                  rest_api_port=0, mixed_precision=precision)
        try:
            served[precision or "float32"] = _served_probabilities(server, images)
            (line,) = _runtime_lines(server)
            assert 'precision="%s"' % (precision or "float32") in line
            assert 'xla_cpu_jit="false"' in line and 'model_name="resnet"' in line
        finally:
            server.stop()
    full, mixed = served["float32"], served[session_lib.BFLOAT16]
    agreement = float(np.mean(full.argmax(1) == mixed.argmax(1)))
    max_dp = float(np.abs(full - mixed).max())
    print("bfloat16 vs float32 served, %d validation images: argmax agreement %.4f, max "
          "|dp| %.4f" % (len(images), agreement, max_dp))
    assert max_dp > 0  # the rewrite ran: bfloat16 rounds differently
    return agreement, max_dp


def test_bfloat16_server_agrees_with_float32_on_validation_images(export_dir, digits_data,
                                                                 caplog):
    if compute.bfloat16_unavailable():  # TF_ENABLE_ONEDNN_OPTS=0: the rewrite cannot run
        base = os.path.dirname(export_dir)
        server = serve_in_process([model_config.ServedModel("resnet", base)],
                                  rest_api_port=0, mixed_precision=session_lib.BFLOAT16)
        try:
            (line,) = _runtime_lines(server)
        finally:
            server.stop()
        assert 'precision="float32"' in line  # says what it computes in
        assert "bfloat16 rewrite needs them; computing in float32" in caplog.text
        return
    agreement, max_dp = _bfloat16_agreement(export_dir, digits_data)
    assert agreement >= MIN_AGREEMENT_60_STEPS, (agreement, max_dp)


def test_unsupported_mode_is_logged_as_tf_serving_does_and_runs_float32(caplog):
    caplog.set_level(logging.INFO)
    config = session_lib.session_config(options_lib.ServerOptions(mixed_precision="fp16"))
    assert session_lib.precision(config) == session_lib.FLOAT32
    assert "fp16 auto mixed precision is not supported. Valid option: bfloat16" in caplog.text
    config = session_lib.session_config(options_lib.ServerOptions(mixed_precision="bfloat16"))
    assert session_lib.precision(config) == (
        session_lib.FLOAT32 if compute.bfloat16_unavailable() else session_lib.BFLOAT16)
    assert "Running inference with bfloat16 auto mixed precision" in caplog.text


def test_a_cpu_without_native_bfloat16_is_warned_about(monkeypatch, caplog):
    monkeypatch.setattr(cpu, "cpu_supports_bf16", lambda: False)
    session_lib.session_config(options_lib.ServerOptions(mixed_precision="bfloat16"))
    if compute.bfloat16_unavailable():  # oneDNN off: the rewrite cannot run at all
        assert "bfloat16 rewrite needs them; computing in float32" in caplog.text
    else:
        assert "only emulates bfloat16" in caplog.text


def _xla_ops(servable, signature_name, feeds):
    """XLA launch ops in the graphs a session.run of the signature executed."""
    sig = servable.signatures[signature_name]
    metadata = tf.compat.v1.RunMetadata()
    servable.session.run([t.name for t in sig.outputs.values()],
                         {sig.inputs[k].name: v for k, v in feeds.items()},
                         options=tf.compat.v1.RunOptions(output_partition_graphs=True),
                         run_metadata=metadata)
    return sum(node.op.startswith("_Xla") for graph in metadata.partition_graphs
               for node in graph.node)


@pytest.mark.cost(9)
def test_xla_compiles_the_served_graph(export_dir, digits_data):
    images = splits.read_images(digits_data, schema.VALIDATION, 16)[0]
    base = os.path.dirname(export_dir)
    pixels = np.random.RandomState(0).uniform(0, 255, [2, 32, 32, 3]).astype(np.float32)
    answers = {}
    for xla in (False, True):
        server = serve_in_process([model_config.ServedModel("resnet", base)],
                                  rest_api_port=0, xla_cpu_compilation_enabled=xla)
        try:
            servable = server.manager.acquire("resnet")
            try:
                assert servable.xla_jit is xla
                compiled = _xla_ops(servable, signatures.PREDICT_IMAGES,
                                    {signatures.IMAGES: pixels})
                assert (compiled > 0) is xla, compiled
            finally:
                servable.release()
            answers[xla] = _served_probabilities(server, images)
            (line,) = _runtime_lines(server)
            assert 'xla_cpu_jit="%s"' % ("true" if xla else "false") in line
        finally:
            server.stop()
    np.testing.assert_allclose(answers[True], answers[False], atol=1e-4)


def test_export_verification_records_bfloat16_parity(export_dir, digits_data):
    """The exporters' verification wrote the bfloat16 figures next to the float32 ones,
    and the same measure runs on every validation image."""
    with open(os.path.join(export_dir, signatures.EXTRA_DIR, verify.REPORT_FILE)) as handle:
        report = json.load(handle)
    assert report["max_abs_probability_diff"] < 1e-5
    if "bf16_unavailable" in report:  # no native bf16 here, or oneDNN off: said, not measured
        assert cpu.cpu_supports_bf16() is False or compute.bfloat16_unavailable()
        assert ("TF_ENABLE_ONEDNN_OPTS=0" in report["bf16_unavailable"]
                or "neither AVX512_BF16 nor AMX" in report["bf16_unavailable"])
        assert "bf16_images" not in report
        return
    assert report["bf16_images"] > 0 and 0.5 <= report["bf16_argmax_agreement"] <= 1.0
    assert 0 < report["bf16_max_abs_probability_diff"] < 0.5
    images = splits.read_images(digits_data, schema.VALIDATION, 10000)[0]
    reference = servable_lib.Servable("reference", 0, export_dir)
    try:
        sig = reference.signatures[signatures.DEFAULT]
        full = np.concatenate([reference.run(sig, {signatures.IMAGE_BYTES: np.array(
            images[i:i + 64], object)}, [signatures.PROBABILITIES])[signatures.PROBABILITIES]
            for i in range(0, len(images), 64)])
    finally:
        reference.retire()
    parity = verify.bfloat16_parity(export_dir, images, full)
    if "bf16_unavailable" in parity:
        return
    print("export bfloat16 parity on %d validation images: %s" % (len(images), parity))
    assert parity["bf16_images"] == len(images)
    assert parity["bf16_argmax_agreement"] >= MIN_AGREEMENT_60_STEPS
