"""TLS from TF Serving's SSLConfig (--ssl_config_file): server key and certificate, an
optional CA to verify clients with, and whether a client certificate is required.

As in tensorflow_model_server, the file holds the PEM texts themselves, not paths:

    server_key: "-----BEGIN PRIVATE KEY-----\\n..."
    server_cert: "-----BEGIN CERTIFICATE-----\\n..."
    custom_ca: "-----BEGIN CERTIFICATE-----\\n..."
    client_verify: true
"""
import os
import ssl
import tempfile

import grpc

from slimserve import errors


def check_ssl_config(config, where="--ssl_config_file"):
    """Checks an SSLConfig (config/files.py reads the file); UserErrors name `where` (the
    flag and file) and the field. Returns the config."""
    for field in ("server_key", "server_cert"):
        if not getattr(config, field).strip():
            raise errors.UserError("%s: %s is empty (it holds the PEM text itself)"
                                   % (where, field))
    if config.client_verify and not config.custom_ca.strip():
        raise errors.UserError("%s: client_verify needs custom_ca, the CA that signs the "
                               "client certificates" % where)
    try:  # a wrong key, certificate or CA fails here, naming the file, not at first request
        server_ssl_context(config)
    except (ssl.SSLError, ValueError) as error:
        raise errors.UserError("%s: %s" % (where, error)) from None
    return config


def grpc_credentials(config):
    """SSLConfig -> grpc.ServerCredentials (client certificates required if client_verify)."""
    return grpc.ssl_server_credentials(
        [(config.server_key.encode(), config.server_cert.encode())],
        root_certificates=config.custom_ca.encode() if config.custom_ca else None,
        require_client_auth=config.client_verify)


def server_ssl_context(config):
    """SSLConfig -> ssl.SSLContext for the REST front end (TF Serving's REST has no TLS)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    # load_cert_chain reads files only: hand it a private temporary copy, removed at once.
    with tempfile.TemporaryDirectory(prefix="slimserve-tls-") as folder:
        os.chmod(folder, 0o700)
        key, cert = os.path.join(folder, "key.pem"), os.path.join(folder, "cert.pem")
        with open(os.open(key, os.O_WRONLY | os.O_CREAT, 0o600), "w") as handle:
            handle.write(config.server_key)
        with open(cert, "w") as handle:
            handle.write(config.server_cert)
        context.load_cert_chain(cert, key)
    if config.custom_ca:
        context.load_verify_locations(cadata=config.custom_ca)
    context.verify_mode = ssl.CERT_REQUIRED if config.client_verify else ssl.CERT_NONE
    return context
