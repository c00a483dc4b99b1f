"""The reference an export records (assets.extra/reference/) and the `embeddings`
signature: written and read back, refused when damaged, absent from older exports; the
real training export carries both, verified, and serves its embeddings over gRPC and REST
equal to the reference's."""
import base64
import io
import json
import os
import shutil
import urllib.request
import zipfile

import numpy as np
import pytest

from slimserve import conventions
from slimserve.export import reference as export_reference
from slimserve.serving.clients import client as client_lib
from slimserve.serving.config import model_config
from slimserve.serving.observability import image_stats
from slimserve.serving.observability import reference as reference_lib
from slimserve.testing.servers import serve_in_process
from tests.drift_fixtures import drift_model, drift_parts  # noqa: F401


def test_the_reference_is_written_and_read_back(drift_model, drift_parts):
    version_dir = os.path.join(drift_model, "1")
    reference = reference_lib.read(version_dir)
    count = len(drift_parts["reference"])
    assert reference.size == count  # fewer than the sample size: every image once
    assert reference.class_names == [str(d) for d in range(10)]
    assert reference.probabilities.shape == (count, 10)
    np.testing.assert_allclose(reference.probabilities.sum(axis=1), 1.0, atol=1e-5)
    assert reference.embeddings.shape == (count, 64)
    assert reference.image_stats.shape == (count, len(image_stats.NAMES))
    assert set(reference.image_stats[:, 0]) == {32.0}  # digits at 32x32
    assert 0.3 < reference.image_stats[:, 3].mean() < 1.0  # dark digits on a light ground
    assert sorted(np.bincount(reference.labels)) == sorted(
        np.bincount([int(c) for _, c in drift_parts["reference"]]))
    assert reference.train_counts.sum() == len(drift_parts["fit"])
    assert 0.8 < float(np.mean(reference.predicted == reference.labels)) <= 1.0
    examples = os.listdir(os.path.join(reference_lib.directory(version_dir), "examples"))
    assert sorted(examples)[:3] == ["0_0.png", "0_1.png", "0_2.png"] and len(examples) == 30


def test_the_sample_is_bounded_and_drawn_from_the_whole_split(tmp_path, drift_model):
    data = os.path.join(os.path.dirname(drift_model), "data-1")
    sample, examples = export_reference.sample_split(data, "validation", 40,
                                                     examples_per_class=2)
    assert len(sample) == 40
    assert len({label for _, label in sample}) >= 8  # not the split's first classes only
    assert all(len(kept) == 2 for kept in examples.values()) and len(examples) == 10


def _copy(drift_model, tmp_path):
    base = tmp_path / "copy"
    shutil.copytree(drift_model, base)
    return str(base / "1")


def test_a_version_without_a_reference_reads_as_none(drift_model, tmp_path):
    version_dir = _copy(drift_model, tmp_path)
    shutil.rmtree(reference_lib.directory(version_dir))
    assert reference_lib.read(version_dir) is None


def _pickled_npz():
    buffer = io.BytesIO()
    np.savez(buffer, probabilities=np.array([{"a": 1}], dtype=object))
    return buffer.getvalue()


def _zip_bomb():
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("probabilities.npy", b"\0" * (reference_lib.MAX_SAMPLES_BYTES + 1))
    return buffer.getvalue()


@pytest.mark.parametrize("name, data, message", [
    ("reference.json", b"{not json", "not JSON"),
    ("reference.json", b'{"format": 99}', "not a reference of format 1"),
    ("samples.npz", b"PK\x03\x04 torn", "not a reference's arrays"),
    ("samples.npz", _pickled_npz(), "not a reference's arrays"),
    ("samples.npz", _zip_bomb(), "unpack to more than"),
])
def test_a_damaged_reference_is_refused_naming_the_file(drift_model, tmp_path, name, data,
                                                        message):
    version_dir = _copy(drift_model, tmp_path)
    path = os.path.join(reference_lib.directory(version_dir), name)
    with open(path, "wb") as handle:
        handle.write(data)
    with pytest.raises(reference_lib.BadReference, match=message) as caught:
        reference_lib.read(version_dir)
    assert name in str(caught.value)


def test_arrays_that_do_not_fit_each_other_are_refused(drift_model, tmp_path):
    version_dir = _copy(drift_model, tmp_path)
    reference = reference_lib.read(version_dir)
    reference.embeddings = reference.embeddings[:-1]  # one row short
    reference_lib.write(version_dir, reference)
    with pytest.raises(reference_lib.BadReference, match="embeddings must be"):
        reference_lib.read(version_dir)


def test_the_training_export_has_a_verified_embeddings_signature_and_a_reference(
        export_dir):
    report = json.load(open(os.path.join(export_dir, conventions.EXTRA_DIR,
                                         "export_verification.json")))
    assert report["embedding_size"] == 2048  # resnet_v1_50's pooled features
    reference = reference_lib.read(export_dir)
    assert reference.embeddings.shape[1] == 2048 and reference.size > 100
    assert reference.train_priors is not None and abs(reference.train_priors.sum() - 1) < 1e-6


def test_embeddings_are_served_over_grpc_and_rest_as_the_reference_has_them(
        export_dir, digits_data):
    reference = reference_lib.read(export_dir)
    sample, _ = export_reference.sample_split(digits_data, "validation", 512)
    assert len(sample) == reference.size  # every validation image, in order
    images = [encoded for encoded, _ in sample[:2]]
    base, version = os.path.split(export_dir)
    server = serve_in_process([model_config.ServedModel("resnet", base)],
                              enable_model_warmup=False)
    try:
        client = client_lib.Client("127.0.0.1:%d" % server.port, retries=0)
        served = client.predict_images(images, conventions.EMBEDDINGS_SIGNATURE)
        client.close()
        body = json.dumps({"signature_name": conventions.EMBEDDINGS_SIGNATURE,
                           "instances": [{"b64": base64.b64encode(i).decode()}
                                         for i in images]}).encode()
        request = urllib.request.Request(
            "http://127.0.0.1:%d/v1/models/resnet/versions/%s:predict"
            % (server.rest_api_port, version), body, {"Content-Type": "application/json"})
        rest = json.loads(urllib.request.urlopen(request, timeout=60).read())
    finally:
        server.stop()
    grpc_embeddings = np.asarray(served[conventions.EMBEDDINGS])
    assert grpc_embeddings.shape == (2, 2048)
    np.testing.assert_allclose(grpc_embeddings, reference.embeddings[:2], rtol=1e-4,
                               atol=1e-4)
    np.testing.assert_allclose(np.asarray(rest["predictions"], np.float32), grpc_embeddings,
                               rtol=1e-5, atol=1e-5)
