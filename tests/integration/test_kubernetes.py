"""The Kubernetes manifests and the Dockerfile, checked offline: core kinds against
Kubernetes' own schemas (kubernetes-validate), every flag against the command that reads
it (the training Jobs' flagfiles parsed by slimserve-train itself), TF_CONFIG of the
training tasks against each other, the ConfigMaps against the files they copy, the images
against the Dockerfile targets that build them, the Dockerfile's COPY sources against the
repository, and the KServe InferenceService (a CRD, no bundled schema) structurally."""
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
DOCKERFILE = os.path.join(ROOT, "Dockerfile")
IMAGE_PREFIX = "REGISTRY/"  # the placeholder a user replaces with their registry
KUBERNETES_VERSION = "1.30.0"
CORE = ("Deployment", "Service", "HorizontalPodAutoscaler", "ConfigMap", "Job",
        "PersistentVolumeClaim")

# tensorflow_model_server's flags, from TF Serving 2.15.1's
# tensorflow_serving/model_servers/main.cc (every tensorflow::Flag("...") there):
#   git -C <tensorflow/serving clone> show \
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


# Flags absl.app defines only once a command runs (so the import above does not list them).
ABSL_APP_FLAGS = frozenset(["help", "helpshort", "helpfull", "helpxml"])


def documents():
    docs = []
    for path in sorted(glob.glob(os.path.join(MANIFESTS, "*.yaml"))):
        with open(path) as handle:
            docs += [(os.path.basename(path), doc) for doc in yaml.safe_load_all(handle) if doc]
    return docs


def pod_spec(doc):
    return doc.get("spec", {}).get("template", {}).get("spec", {})


def containers(doc):
    """The pod's containers, then its init containers (the parameter server is one)."""
    pod = pod_spec(doc)
    return pod.get("containers", []) + pod.get("initContainers", [])


def configmap(name):
    (found,) = [d for _, d in documents() if d["kind"] == "ConfigMap"
                and d["metadata"]["name"] == name]
    return found


def flagfile_text(doc, container, path):
    """The text a container reads at `path`: a key of the ConfigMap mounted above it."""
    volumes = {v["name"]: v for v in pod_spec(doc).get("volumes", [])}
    for mount in container.get("volumeMounts", []):
        directory, name = os.path.split(path)
        if directory == mount["mountPath"] and "configMap" in volumes[mount["name"]]:
            return configmap(volumes[mount["name"]]["configMap"]["name"])["data"][name]
    raise AssertionError("%s: nothing mounted at %s" % (container["name"], path))


def flagfile_args(text):
    return [line.strip() for line in text.splitlines()
            if line.strip() and not line.strip().startswith("#")]


def expanded_args(doc, container):
    """The container's arguments with each --flagfile replaced by the flags in it."""
    args = []
    for arg in container.get("args", []):
        if arg.startswith("--flagfile="):
            args += flagfile_args(flagfile_text(doc, container, arg.split("=", 1)[1]))
        else:
            args.append(arg)
    return args


def dockerfile_targets():
    """{image name without tag: Dockerfile target} from the Dockerfile's header lines
    `docker build --target TARGET -t IMAGE:TAG .`, checked to name real stages."""
    with open(DOCKERFILE) as handle:
        text = handle.read()
    stages = set(re.findall(r"^FROM \S+ AS (\S+)$", text, re.M))
    built = dict((image, target) for target, image in re.findall(
        r"docker build --target (\S+)\s+-t (\S+):\S+ \.", text))
    assert built and set(built.values()) <= stages, (built, stages)
    return built


def console_scripts():
    """{script name: command module} from setup.py's entry points."""
    with open(os.path.join(ROOT, "setup.py")) as handle:
        text = handle.read()
    return dict(re.findall(r'"(slimserve-[a-z]+)=([a-z_.]+):run"', text))


@pytest.fixture(scope="module")
def command_flags():
    """{command module: its absl flags} for every command the manifests and the
    Dockerfile run: those it defines at import, plus those of its config class (CONFIG)
    when it is built on one; each module is imported in its own interpreter (two commands
    may define a flag of the same name), all at once."""
    modules = set(console_scripts().values())
    code = ("import importlib, json\nfrom absl import flags\nfrom slimserve import fields\n"
            "command = importlib.import_module(%r)\n"
            "if hasattr(command, 'CONFIG'):  # flags defined from its config class\n"
            "    fields.define_flags(command.CONFIG)\n"
            "print(json.dumps(sorted(flags.FLAGS)))")
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
            image, args = container["image"], expanded_args(doc, container)
            if image.startswith("tensorflow/serving:"):
                assert image == "tensorflow/serving:2.15.0"
                known, where = TF_SERVING_FLAGS, "tensorflow_model_server 2.15"
            else:
                assert image.startswith(IMAGE_PREFIX + "slimserve"), image
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
    tfserving_config = configmap("tfserving-config")
    for name, text in tfserving_config["data"].items():
        with open(os.path.join(ROOT, "serving", "tfserving", name)) as handle:
            assert text == handle.read(), "ConfigMap %s differs from serving/tfserving" % name
    (container,) = containers(deployment)
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    for arg in container["args"]:
        if arg.split("=")[0].endswith("_file"):
            directory, name = os.path.split(arg.split("=", 1)[1])
            assert directory == mounts["config"] and name in tfserving_config["data"], arg
    assert container["readinessProbe"]["httpGet"]["path"] == "/v1/models/resnet"
    assert container["livenessProbe"]["httpGet"]["path"] == "/v1/models/resnet"
    # A slow model load is not killed: the startupProbe holds liveness off for minutes.
    startup = container["startupProbe"]
    assert startup["httpGet"]["path"] == "/v1/models/resnet"
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600
    assert "initialDelaySeconds" not in container["livenessProbe"]
    assert container["resources"]["requests"]["cpu"]
    assert mounts["models"] == "/models/resnet"  # models.config's base_path


def test_training_jobs_share_one_cluster_and_cover_every_task():
    jobs = [d for _, d in documents() if d["kind"] == "Job"]
    (service,) = [d for _, d in documents() if d["kind"] == "Service"
                  and d["metadata"]["name"] == "slimserve-train"]
    assert service["spec"]["clusterIP"] == "None"  # headless: one DNS name per pod
    clusters, tasks = [], {}
    for job in jobs:
        pod = pod_spec(job)
        for container in containers(job):
            env = {e["name"]: e["value"] for e in container["env"]}
            tf_config = json.loads(env["TF_CONFIG"])
            task = (tf_config["task"]["type"], tf_config["task"]["index"])
            assert task not in tasks, "two containers for %s" % (task,)
            tasks[task] = (pod, container)
            clusters.append(tf_config["cluster"])
        assert pod["subdomain"] == service["metadata"]["name"]
        assert all(v in job["spec"]["template"]["metadata"]["labels"].items()
                   for v in service["spec"]["selector"].items())
    assert all(cluster == clusters[0] for cluster in clusters)
    cluster = clusters[0]
    assert set(cluster) == {"chief", "worker", "ps"}
    expected = {(kind, i) for kind, hosts in cluster.items() for i in range(len(hosts))}
    assert set(tasks) == expected | {("evaluator", 0)}
    addresses = [address for hosts in cluster.values() for address in hosts]
    assert len(set(addresses)) == len(addresses)
    service_ports = {p["port"] for p in service["spec"]["ports"]}
    for (kind, index), (pod, container) in tasks.items():
        if kind != "evaluator":
            host, port = cluster[kind][index].rsplit(":", 1)
            assert host == "%s.%s" % (pod["hostname"], pod["subdomain"])
            assert int(port) in [p["containerPort"] for p in container["ports"]]
            assert int(port) in service_ports


def test_every_training_job_ends_by_itself():
    """A parameter server never exits on its own (it serves variables until killed), so
    it runs as a native sidecar of the chief's pod (an init container with restartPolicy
    Always): Kubernetes stops it when the chief's container completes. No Job runs a
    parameter server as its main container."""
    jobs = [d for _, d in documents() if d["kind"] == "Job"]
    for job in jobs:
        for container in pod_spec(job)["containers"]:
            env = {e["name"]: e["value"] for e in container["env"]}
            assert json.loads(env["TF_CONFIG"])["task"]["type"] != "ps", \
                "%s would never complete" % job["metadata"]["name"]
    (chief,) = [j for j in jobs if j["metadata"]["labels"]["slimserve/task-type"] == "chief"]
    (ps,) = pod_spec(chief)["initContainers"]
    assert ps["restartPolicy"] == "Always"
    wait = int(ps["lifecycle"]["preStop"]["exec"]["command"][-1])
    assert pod_spec(chief)["terminationGracePeriodSeconds"] > wait


def test_jobs_run_as_the_image_user_and_can_write_the_shared_volume():
    with open(DOCKERFILE) as handle:
        users = set(re.findall(r"^USER (\d+):(\d+)$", handle.read(), re.M))
    assert users == {("1000", "1000")}  # numeric, so runAsNonRoot can check it
    for _, job in [d for d in documents() if d[1]["kind"] == "Job"]:
        context = pod_spec(job)["securityContext"]
        assert context["runAsNonRoot"] is True
        assert (str(context["runAsUser"]), str(context["runAsGroup"])) == ("1000", "1000")
        assert context["fsGroup"] == 1000, job["metadata"]["name"]
        for container in containers(job):
            assert container["securityContext"]["allowPrivilegeEscalation"] is False


def test_images_are_registry_placeholders_built_by_a_dockerfile_target():
    """Every slimserve image is REGISTRY/<name>:<tag>, built by a Dockerfile target named
    in its header; the training containers on a GPU image ask for a GPU, the others not."""
    built = dockerfile_targets()
    seen = set()
    for _, doc in documents():
        for container in containers(doc):
            image = container["image"]
            if image.startswith("tensorflow/"):
                continue
            name = image.rsplit(":", 1)[0]
            assert name in built, "%s: no `docker build --target ... -t %s:...` in the " \
                "Dockerfile" % (image, name)
            seen.add(built[name])
            gpus = container.get("resources", {}).get("limits", {}).get("nvidia.com/gpu")
            assert (gpus == 1) == (built[name] == "gpu"), (container["name"], image, gpus)
    assert seen == {"train", "gpu"}


def test_training_flags_configmap_copies_the_recipe_and_cluster_files():
    """One argument source: the ConfigMap holds the docs' recipe (a configs/ flagfile,
    named in its regenerate command) and cluster.flags, byte for byte; no flag is in both,
    so their order cannot matter."""
    flags_map = configmap("slimserve-train-flags")
    with open(os.path.join(MANIFESTS, "training-flags.yaml")) as handle:
        header = handle.read()
    sources = dict(re.findall(r"--from-file=([\w.]+)=(\S+)", header))
    assert set(sources) == set(flags_map["data"]) == {"recipe.flags", "cluster.flags"}
    assert sources["recipe.flags"].startswith("configs/")
    for key, path in sources.items():
        with open(os.path.join(ROOT, path)) as handle:
            assert flags_map["data"][key] == handle.read(), "%s differs from %s" % (key, path)
    names = {key: {line.split("=", 1)[0] for line in flagfile_args(text)}
             for key, text in flags_map["data"].items()}
    assert not names["recipe.flags"] & names["cluster.flags"]


def test_training_flagfiles_parse_as_slimserve_train_reads_them(tmp_path):
    """Each training container's command line, its flagfiles written out as mounted,
    parsed by slimserve-train's own flags (types, bounds, validators) and its TrainConfig's
    rules."""
    code = ("import json, sys\nfrom absl import flags\nfrom slimserve import fields\n"
            "from slimserve.cli import train\nfields.define_flags(train.CONFIG)\n"
            "flags.FLAGS(['slimserve-train'] + sys.argv[1:])\n"
            "fields.from_flags(train.CONFIG).validate()\n"
            "print(json.dumps({n: flags.FLAGS[n].value for n in "
            "('data_dir', 'model_dir', 'checkpoint_path', 'mode', 'optimizer')}))")
    lines = set()
    for _, job in [d for d in documents() if d[1]["kind"] == "Job"]:
        for container in containers(job):
            args = []
            for arg in container["args"]:
                assert arg.startswith("--flagfile=/etc/slimserve/"), arg
                path = arg.split("=", 1)[1]
                local = tmp_path / os.path.basename(path)
                local.write_text(flagfile_text(job, container, path))
                args.append("--flagfile=%s" % local)
            lines.add(tuple(args))
    (args,) = lines  # every task runs the same command line
    out = subprocess.run([sys.executable, "-c", code] + list(args), cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    values = json.loads(out.stdout.strip().splitlines()[-1])
    assert values["data_dir"] == "/work/data" and values["model_dir"] == "/work/run"
    assert values["checkpoint_path"].startswith("/work/")
    recipe = configmap("slimserve-train-flags")["data"]["recipe.flags"]
    assert "--optimizer=%s" % values["optimizer"] in recipe  # the recipe's, not a default


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


def _dockerfile_stages():
    """[(stage name, base, its instructions with continuation lines joined)]."""
    with open(DOCKERFILE) as handle:
        text = handle.read().replace("\\\n", " ")
    stages = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("FROM "):
            words = line.split()
            stages.append((words[3] if len(words) > 3 else None, words[1], []))
        else:
            stages[-1][2].append(line)
    return stages


def test_dockerfile_copies_what_exists_and_every_package(command_flags):
    """Each COPY source is a file or folder git tracks; every package folder setup.py
    installs is copied (slimserve/ was once missing, so no command could start), and so
    is configs/ (the flagfile recipes)."""
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    copied = set()
    for _, _, instructions in _dockerfile_stages():
        for line in instructions:
            if not line.startswith("COPY ") or "--from=" in line:
                continue
            for source in line.split()[1:-1]:
                source = source.rstrip("/")
                assert source in tracked or any(f.startswith(source + "/") for f in tracked), \
                    "Dockerfile copies %s, which the repository does not have" % source
                copied.add(source)
    with open(os.path.join(ROOT, "setup.py")) as handle:
        setup = handle.read()
    packages = set(re.findall(r'LIBRARIES = \(([^)]*)\)', setup)[0].replace('"', "").replace(
        ",", " ").split()) | {"slimserve"}
    assert packages | {"configs", "setup.py"} <= copied, copied


def test_dockerfile_targets_install_what_they_are_for(command_flags):
    stages = {name: (base, instructions) for name, base, instructions in _dockerfile_stages()}
    assert stages["base"][0].startswith("python:3.11")
    installs = {name: " ".join(line for line in instructions if line.startswith("RUN pip"))
                for name, (_, instructions) in stages.items()}
    assert 'pip install ".[beam]"' in installs["train-deps"]
    assert "beam" not in installs["serving-deps"]  # the serving image has no Beam
    assert '"tensorflow[and-cuda]>=2.15,<2.16"' in installs["gpu-deps"]
    for target in dockerfile_targets().values():
        base, instructions = stages[target]
        assert base == target + "-deps" and "COPY --from=source /opt/slimserve/ " \
            "/opt/slimserve/" in instructions, target
        assert "USER 1000:1000" in instructions
    scripts = console_scripts()
    for name, (_, instructions) in stages.items():
        for line in instructions:
            if line.startswith("CMD "):
                cmd = json.loads(line[4:])
                assert cmd[0] in scripts, (name, cmd)
                known = command_flags[scripts[cmd[0]]] | ABSL_APP_FLAGS
                assert all(n in known for n in flag_names(cmd[1:])), (name, cmd)
