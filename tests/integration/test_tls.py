"""--ssl_config_file: TF Serving's SSLConfig (PEM texts inline) with a throwaway CA, server
and client certificates made here; gRPC and REST require the client certificate."""
import datetime
import ipaddress
import json
import ssl
import urllib.error
import urllib.request

import grpc
import numpy as np
import pytest
import tensorflow as tf
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from tensorflow_serving.apis import predict_pb2
from tensorflow_serving.apis import prediction_service_pb2_grpc

from slimserve import errors as user_errors
from slimserve.serving.config import model_config  # pylint: disable=import-outside-toplevel
from slimserve.serving.api import tls
from slimserve.serving.config import files as config_files
from slimserve.testing import tiny_models
from slimserve.testing.servers import serve_in_process


def _key():
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key):
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


def _pem_cert(cert):
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def _certificate(subject, key, issuer, issuer_key, ca=False, server=False):
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
               .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if server:
        builder = builder.add_extension(x509.SubjectAlternativeName([
            x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pki")
    ca_key, server_key, client_key, stranger_key = _key(), _key(), _key(), _key()
    ca = _certificate("slimserve test CA", ca_key, "slimserve test CA", ca_key, ca=True)
    files = {
        "ca.pem": _pem_cert(ca),
        "server.pem": _pem_cert(_certificate("localhost", server_key, "slimserve test CA",
                                             ca_key, server=True)),
        "server.key": _pem_key(server_key),
        "client.pem": _pem_cert(_certificate("client", client_key, "slimserve test CA",
                                             ca_key)),
        "client.key": _pem_key(client_key),
        # signed by itself, not by the CA the server trusts
        "stranger.pem": _pem_cert(_certificate("stranger", stranger_key, "stranger",
                                               stranger_key)),
        "stranger.key": _pem_key(stranger_key),
    }
    for name, text in files.items():
        (folder / name).write_text(text)
    config = folder / "ssl.config"
    config.write_text('server_key: "%s"\nserver_cert: "%s"\ncustom_ca: "%s"\n'
                      'client_verify: true\n' % tuple(
                          files[n].replace("\n", "\\n")
                          for n in ("server.key", "server.pem", "ca.pem")))
    return folder, files, str(config)


@pytest.fixture(scope="module")
def server(pki, tmp_path_factory):
    _, _, config = pki
    base = str(tmp_path_factory.mktemp("tls") / "tiny")
    tiny_models.write_tiny_model(base, 1)
    instance = serve_in_process([model_config.ServedModel("tiny", base)], ssl_config_file=config)
    yield instance
    instance.stop()



def _predict(channel):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "tiny"
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array([[1.0, 2.0]], np.float32)))
    response = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(
        request, timeout=30)
    return tf.make_ndarray(response.outputs["y"]).ravel().tolist()


def _secure(server, files, client=None):
    credentials = grpc.ssl_channel_credentials(
        root_certificates=files["ca.pem"].encode(),
        private_key=files[client + ".key"].encode() if client else None,
        certificate_chain=files[client + ".pem"].encode() if client else None)
    return grpc.secure_channel("127.0.0.1:%d" % server.port, credentials)


def test_grpc_requires_a_client_certificate_signed_by_custom_ca(server, pki):
    _, files, _ = pki
    with _secure(server, files, "client") as channel:
        assert _predict(channel) == pytest.approx(tiny_models.expected_y([(1.0, 2.0)]))
    for client in (None, "stranger"):
        with _secure(server, files, client) as channel:
            with pytest.raises(grpc.RpcError) as caught:
                _predict(channel)
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE, client
    with grpc.insecure_channel("127.0.0.1:%d" % server.port) as channel:
        with pytest.raises(grpc.RpcError):
            _predict(channel)


def test_rest_is_https_with_the_same_config(server, pki):
    folder, _, _ = pki
    url = "https://127.0.0.1:%d/v1/models/tiny" % server.rest_api_port
    context = ssl.create_default_context(cafile=str(folder / "ca.pem"))
    context.load_cert_chain(str(folder / "client.pem"), str(folder / "client.key"))
    with urllib.request.urlopen(url, context=context, timeout=30) as response:
        assert json.loads(response.read())["model_version_status"][0]["state"] == "AVAILABLE"
    anonymous = ssl.create_default_context(cafile=str(folder / "ca.pem"))
    with pytest.raises((ssl.SSLError, ConnectionError, urllib.error.URLError)):
        with urllib.request.urlopen(url, context=anonymous, timeout=30) as response:
            response.read()


def test_bad_ssl_configs_name_the_file_and_field(tmp_path, pki):
    _, files, _ = pki
    cases = {
        "unknown field": ('server_key: "k"\nserver_certificate: "c"\n', "server_certificate"),
        "empty key": ('server_cert: "c"\n', "server_key is empty"),
        "verify without CA": ('server_key: "%s"\nserver_cert: "%s"\nclient_verify: true\n' % (
            files["server.key"].replace("\n", "\\n"), files["server.pem"].replace("\n", "\\n")),
            "client_verify needs custom_ca"),
        "not PEM": ('server_key: "junk"\nserver_cert: "junk"\n', "--ssl_config_file"),
    }
    for case, (text, expected) in cases.items():
        path = tmp_path / ("%s.config" % case.replace(" ", "_"))
        path.write_text(text)
        with pytest.raises(user_errors.UserError) as caught:
            tls.check_ssl_config(config_files.read_ssl_config(str(path)), "--ssl_config_file %s" % path)
        assert expected in str(caught.value) and str(path) in str(caught.value), case
