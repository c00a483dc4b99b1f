"""The Kubernetes manifests, checked offline: core kinds against Kubernetes' own schemas
(kubernetes-validate), every flag against the command that reads it, TF_CONFIG of the
training tasks against each other, the ConfigMap against serving/tfserving/, and the
KServe InferenceService (a CRD, no bundled schema) structurally."""
import glob
import json
import os
import re
import subprocess
import sys

import kubernetes_validate
import pytest
import yaml

from tests.helpers import ROOT

MANIFESTS = os.path.join(ROOT, "serving", "kubernetes")
KUBERNETES_VERSION = "1.30.0"
CORE = ("Deployment", "Service", "HorizontalPodAutoscaler", "ConfigMap", "Job",
        "PersistentVolumeClaim")

# tensorflow_model_server's flags, from TF Serving 2.15.1's
# tensorflow_serving/model_servers/main.cc (every tensorflow::Flag("...") there):
#   git -C /work/.mirror/tensorflow+serving/repo show \
#     2.15.1:tensorflow_serving/model_servers/main.cc
TF_SERVING_FLAGS = frozenset("""
port grpc_socket_path rest_api_port rest_api_num_threads rest_api_timeout_in_ms
rest_api_enable_cors_support enable_batching allow_version_labels_for_unavailable_models
batching_parameters_file enable_per_model_batching_parameters model_config_file
model_config_file_poll_wait_seconds model_name model_base_path num_load_threads
num_unload_threads max_num_load_retries load_retry_interval_micros
file_system_poll_wait_seconds flush_filesystem_caches tensorflow_session_parallelism
tensorflow_session_config_file tensorflow_intra_op_parallelism
tensorflow_inter_op_parallelism use_alts_credentials ssl_config_file platform_config_file
per_process_gpu_memory_fraction saved_model_tags grpc_channel_arguments grpc_max_threads
enable_model_warmup num_request_iterations_for_warmup version monitoring_config_file
remove_unused_fields_from_bundle_metagraph prefer_tflite_model num_tflite_pools
num_tflite_interpreters_per_pool enable_signature_method_name_check
xla_cpu_compilation_enabled enable_profiler thread_pool_factory_config_file mixed_precision
skip_initialize_tpu enable_grpc_healthcheck_service
""".split())


def documents():
    docs = []
    for path in sorted(glob.glob(os.path.join(MANIFESTS, "*.yaml"))):
        with open(path) as handle:
            docs += [(os.path.basename(path), doc) for doc in yaml.safe_load_all(handle) if doc]
    return docs


def containers(doc):
    spec = doc.get("spec", {})
    pod = spec.get("template", {}).get("spec", {})
    return pod.get("containers", [])


def console_scripts():
    """{script name: command module} from setup.py's entry points."""
    with open(os.path.join(ROOT, "setup.py")) as handle:
        text = handle.read()
    return dict(re.findall(r'"(slimserve-[a-z]+)=([a-z_.]+):run"', text))


@pytest.fixture(scope="module")
def command_flags():
    """{command module: its absl flags} for every command the manifests and the
    Dockerfile run; each module is imported in its own interpreter (two commands may
    define a flag of the same name), all at once."""
    modules = set(console_scripts().values())
    code = "import json, %s\nfrom absl import flags\nprint(json.dumps(sorted(flags.FLAGS)))"
    processes = {module: subprocess.Popen([sys.executable, "-c", code % module], cwd=ROOT,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True)
                 for module in modules if module.startswith(("slimserve.cli.train",
                                                             "slimserve.cli.server"))}
    found = {}
    for module, process in processes.items():
        out, err = process.communicate(timeout=300)
        assert process.returncode == 0, err[-3000:]
        found[module] = set(json.loads(out.strip().splitlines()[-1]))
    return found


def flag_names(args):
    names = []
    for arg in args:
        assert arg.startswith("--"), "positional argument %r: our CLIs take none" % arg
        name = arg[2:].split("=", 1)[0]
        names.append(name[2:] if name.startswith("no") and "=" not in arg else name)
    return names


def test_core_manifests_validate_against_kubernetes_schemas():
    kinds = []
    for filename, doc in documents():
        if doc["kind"] in CORE:
            try:
                kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
            except kubernetes_validate.ValidationError as error:
                raise AssertionError("%s %s/%s: %s" % (filename, doc["kind"],
                                                       doc["metadata"]["name"], error)) from None
            kinds.append(doc["kind"])
    assert {"Deployment", "Service", "HorizontalPodAutoscaler", "ConfigMap", "Job"} <= set(kinds)


def test_schema_validation_catches_a_misspelt_field():
    """The check above can fail: a typo in a probe is refused by the strict schema."""
    (deployment,) = [d for _, d in documents() if d["kind"] == "Deployment"]
    probe = containers(deployment)[0]["readinessProbe"]
    probe["httpGett"] = probe.pop("httpGet")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)


def test_every_flag_is_one_the_command_accepts(command_flags):
    scripts = console_scripts()
    checked = 0
    for filename, doc in documents():
        for container in containers(doc):
            image, args = container["image"], container.get("args", [])
            if image.startswith("tensorflow/serving:"):
                assert image == "tensorflow/serving:2.15.0"
                known, where = TF_SERVING_FLAGS, "tensorflow_model_server 2.15"
            else:
                assert image.startswith("slimserve:"), image
                (script,) = container["command"]
                assert script in scripts, "%s: %s is no console script" % (filename, script)
                module = scripts[script]
                known, where = command_flags[module], module
            for name in flag_names(args):
                assert name in known, "%s: --%s is not a flag of %s" % (filename, name, where)
                checked += 1
    assert checked > 20


def test_tfserving_mounts_the_config_files_it_is_given():
    (deployment,) = [d for _, d in documents() if d["kind"] == "Deployment"]
    (configmap,) = [d for _, d in documents() if d["kind"] == "ConfigMap"]
    for name, text in configmap["data"].items():
        with open(os.path.join(ROOT, "serving", "tfserving", name)) as handle:
            assert text == handle.read(), "ConfigMap %s differs from serving/tfserving" % name
    (container,) = containers(deployment)
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    for arg in container["args"]:
        if arg.split("=")[0].endswith("_file"):
            directory, name = os.path.split(arg.split("=", 1)[1])
            assert directory == mounts["config"] and name in configmap["data"], arg
    assert container["readinessProbe"]["httpGet"]["path"] == "/v1/models/resnet"
    assert container["livenessProbe"]["httpGet"]["path"] == "/v1/models/resnet"
    assert container["resources"]["requests"]["cpu"]
    assert mounts["models"] == "/models/resnet"  # models.config's base_path


def test_training_jobs_share_one_cluster_and_cover_every_task():
    jobs = [d for _, d in documents() if d["kind"] == "Job"]
    (service,) = [d for _, d in documents() if d["kind"] == "Service"
                  and d["metadata"]["name"] == "slimserve-train"]
    assert service["spec"]["clusterIP"] == "None"  # headless: one DNS name per pod
    clusters, tasks = [], {}
    for job in jobs:
        pod = job["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        env = {e["name"]: e["value"] for e in container["env"]}
        tf_config = json.loads(env["TF_CONFIG"])
        task = (tf_config["task"]["type"], tf_config["task"]["index"])
        assert task not in tasks, "two jobs for %s" % (task,)
        tasks[task] = pod
        clusters.append(tf_config["cluster"])
        assert pod["subdomain"] == service["metadata"]["name"]
        assert all(v in job["spec"]["template"]["metadata"]["labels"].items()
                   for v in service["spec"]["selector"].items())
    assert all(cluster == clusters[0] for cluster in clusters)
    cluster = clusters[0]
    assert set(cluster) == {"chief", "worker", "ps"}
    expected = {(kind, i) for kind, hosts in cluster.items() for i in range(len(hosts))}
    assert set(tasks) == expected | {("evaluator", 0)}
    for (kind, index), pod in tasks.items():
        if kind != "evaluator":
            host, port = cluster[kind][index].rsplit(":", 1)
            assert host == "%s.%s" % (pod["hostname"], pod["subdomain"])
            assert int(port) in [p["containerPort"] for p in pod["containers"][0]["ports"]]


def test_kserve_inference_service_structure():
    (isvc,) = [d for _, d in documents() if d["kind"] == "InferenceService"]
    assert isvc["apiVersion"] == "serving.kserve.io/v1beta1"
    assert re.match(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", isvc["metadata"]["name"])
    model = isvc["spec"]["predictor"]["model"]
    assert model["modelFormat"]["name"] == "tensorflow"
    assert re.match(r"^(pvc|gs|s3|https?)://", model["storageUri"])
    assert set(isvc["spec"]["predictor"]) <= {"minReplicas", "maxReplicas", "scaleMetric",
                                              "scaleTarget", "model"}
    kubernetes_validate.validate(  # its resources block is a core ResourceRequirements
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}, "spec": {
            "containers": [{"name": "x", "image": "x", "resources": model["resources"]}]}},
        KUBERNETES_VERSION, strict=True)


def test_dockerfile_builds_what_the_jobs_run(command_flags):
    with open(os.path.join(ROOT, "Dockerfile")) as handle:
        dockerfile = handle.read()
    assert re.search(r"^FROM python:3\.11", dockerfile, re.M)
    assert 'pip install ".[beam]"' in dockerfile
    scripts = console_scripts()
    cmd = json.loads(re.search(r"^CMD (\[.*?\])$", dockerfile.replace("\\\n", ""),
                               re.M | re.S).group(1))
    assert cmd[0] in scripts
    known = command_flags[scripts[cmd[0]]]
    assert all(name in known for name in flag_names(cmd[1:]))
