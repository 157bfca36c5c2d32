"""The KubeRay manifests validate against KubeRay's CRD schemas (defaults applied first, as the API
server does) and agree with the code: the entrypoint's config exists, --num-workers fits the
worker group, every Ray version equals the one pyproject.toml pins, the pod that runs rank 0 gets
the MLflow settings, and everything they reference (claim, Secret keys) is in prerequisites.yaml."""
import copy
import functools
import re
import shlex
import tomllib
from pathlib import Path

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CRDS = ROOT.parent / "shared" / "kuberay-crds"
MANIFESTS = {"raycluster.yaml": ("ray.io_rayclusters.yaml", "RayCluster"),
             "rayjob.yaml": ("ray.io_rayjobs.yaml", "RayJob")}


def pinned_ray() -> str:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pin = next(d for d in deps if d.startswith("ray["))
    return pin.split("==")[1]


@functools.cache
def _load_crd(crd_file: str) -> dict:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the CRDs are 1-1.4 MB of YAML
    crd = yaml.load((CRDS / crd_file).read_text(), Loader=loader)
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    return version["schema"]["openAPIV3Schema"]


def crd_schema(crd_file: str) -> dict:
    if not (CRDS / crd_file).is_file():
        pytest.skip(f"{CRDS / crd_file} is not beside the checkout")
    return _load_crd(crd_file)


def apply_defaults(instance, schema):
    """Fill in schema defaults the way the Kubernetes API server does before validating."""
    if isinstance(instance, dict) and schema.get("type") == "object":
        for name, prop in schema.get("properties", {}).items():
            if name not in instance and "default" in prop:
                instance[name] = copy.deepcopy(prop["default"])
            if name in instance:
                apply_defaults(instance[name], prop)
    elif isinstance(instance, list) and "items" in schema:
        for item in instance:
            apply_defaults(item, schema["items"])
    return instance


def validate(manifest: dict, crd_file: str) -> None:
    schema = crd_schema(crd_file)
    jsonschema.validate(apply_defaults(copy.deepcopy(manifest), schema), schema)


def load(name: str) -> dict:
    return yaml.safe_load((ROOT / "cluster" / "kuberay" / name).read_text())


@pytest.mark.parametrize("name", sorted(MANIFESTS))
def test_manifest_is_schema_valid(name):
    crd_file, kind = MANIFESTS[name]
    manifest = load(name)
    assert manifest["apiVersion"] == "ray.io/v1" and manifest["kind"] == kind
    validate(manifest, crd_file)


def cluster_spec(name: str) -> dict:
    manifest = load(name)
    return manifest["spec"]["rayClusterSpec"] if manifest["kind"] == "RayJob" else manifest["spec"]


@pytest.mark.parametrize("name", sorted(MANIFESTS))
def test_broken_manifests_fail_the_check(name):
    crd_file, _ = MANIFESTS[name]
    wrong_type = load(name)
    spec = wrong_type["spec"]["rayClusterSpec"] if wrong_type["kind"] == "RayJob" \
        else wrong_type["spec"]
    spec["workerGroupSpecs"][0]["replicas"] = "two"
    with pytest.raises(jsonschema.ValidationError):
        validate(wrong_type, crd_file)
    no_container = load(name)
    spec = no_container["spec"]["rayClusterSpec"] if no_container["kind"] == "RayJob" \
        else no_container["spec"]
    del spec["headGroupSpec"]["template"]["spec"]["containers"]
    with pytest.raises(jsonschema.ValidationError, match="containers"):
        validate(no_container, crd_file)


def drun_args(entrypoint: str) -> list[str]:
    args = shlex.split(entrypoint)
    assert args[:2] == ["drun", "train"], entrypoint
    return args


def test_rayjob_entrypoint_is_consistent_with_the_code_and_the_cluster():
    job = load("rayjob.yaml")
    args = drun_args(job["spec"]["entrypoint"])
    assert (ROOT / args[2]).is_file(), f"entrypoint config {args[2]} does not exist"
    from distributed_runner.cli import build_parser
    parsed = build_parser().parse_args(args[1:])
    assert parsed.launcher == "ray" and parsed.address == "auto"
    assert parsed.name and parsed.storage_path, "retries resume only with a fixed name and storage"
    from distributed_runner import Config
    from distributed_runner.launch.launcher import validate_config
    cfg = Config.fromfile(ROOT / args[2], cfg_options=parsed.cfg_options)
    validate_config(cfg)  # the entrypoint's config, with its overrides, builds
    assert "mlflow" in cfg.default_hooks.logger.sinks  # the Secret's tracking URI is used
    group = job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]
    container = group["template"]["spec"]["containers"][0]
    gpus = int(container["resources"]["limits"].get("nvidia.com/gpu", 0))
    slots = group["replicas"] * (gpus if parsed.gpu else 1)
    assert parsed.num_workers <= slots, f"{parsed.num_workers} workers > {slots} slots"
    assert job["spec"]["shutdownAfterJobFinishes"] is True
    assert job["spec"]["backoffLimit"] >= 1


@pytest.mark.parametrize("name", sorted(MANIFESTS))
def test_cluster_head_takes_no_training_and_gpus_are_tolerated(name):
    spec = cluster_spec(name)
    assert spec["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    for group in spec["workerGroupSpecs"]:
        pod = group["template"]["spec"]
        gpus = pod["containers"][0]["resources"]["limits"].get("nvidia.com/gpu")
        if gpus:
            assert any(t["key"] == "nvidia.com/gpu" for t in pod.get("tolerations", []))


def test_every_ray_version_is_the_pinned_one():
    pin = pinned_ray()
    for name in MANIFESTS:
        assert cluster_spec(name)["rayVersion"] == pin, name
    dockerfile = (ROOT / "cluster" / "Dockerfile").read_text()
    assert re.search(rf"^ARG RAY_VERSION={re.escape(pin)}$", dockerfile, re.M)
    assert "FROM rayproject/ray:${RAY_VERSION}" in dockerfile


def test_runtime_env_keeps_heavy_folders_out_of_the_upload():
    env = yaml.safe_load((ROOT / "cluster" / "runtime_env.yaml").read_text())
    assert {".git", "work_dirs", "data", "*.pth"} <= set(env["excludes"])
    assert all(isinstance(v, str) for v in env["env_vars"].values())


def test_dockerfile_lints_clean():
    """What can be checked without building: instructions, COPY sources, extras, ARG use."""
    text = (ROOT / "cluster" / "Dockerfile").read_text()
    logical, current = [], ""
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        current += " " + line.strip().rstrip("\\")
        if not line.rstrip().endswith("\\"):
            logical.append(current.strip())
            current = ""
    assert not current, "a continuation line ends the file"
    for instruction in logical:
        word = instruction.split()[0]
        assert word in {"ARG", "FROM", "RUN", "WORKDIR", "COPY", "ENV"}, instruction
        if word == "COPY":
            parts = [p for p in instruction.split()[1:] if not p.startswith("--")]
            for src in parts[:-1]:
                assert (ROOT / src).exists(), f"COPY source {src} does not exist"
    assert sum(i.startswith("FROM ") for i in logical) == 1
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extra in re.findall(r'"\.\[(\w+)\]"', text):
        assert extra in extras
    used = set(re.findall(r"\$\{(\w+)\}", text))
    declared = set(re.findall(r"^ARG (\w+)=", text, re.M))
    assert used <= declared, f"undeclared build args: {used - declared}"
    assert "--no-cache-dir" in text


def pods(name: str) -> list[tuple[str, dict, dict]]:
    """(group, rayStartParams, container) of the head and every worker group."""
    spec = cluster_spec(name)
    groups = [("head", spec["headGroupSpec"])] + [(g["groupName"], g)
                                                  for g in spec["workerGroupSpecs"]]
    return [(group, g.get("rayStartParams") or {}, g["template"]["spec"]["containers"][0])
            for group, g in groups]


def env_of(container: dict) -> dict:
    return {e["name"]: e.get("valueFrom", e.get("value")) for e in container.get("env", [])}


@pytest.mark.parametrize("name", sorted(MANIFESTS))
def test_the_pod_that_runs_rank_0_gets_the_tracking_settings(name):
    """The head takes no training (num-cpus 0), so rank 0 — the rank that talks to MLflow — runs
    on a worker pod: every pod that can run a training worker needs the head's MLflow env."""
    head = env_of(pods(name)[0][2])
    assert {"MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_TOKEN"} <= set(head)
    trainers = [(group, container) for group, params, container in pods(name)
                if params.get("num-cpus") != "0"]
    assert trainers and all(group != "head" for group, _ in trainers)
    for group, container in trainers:
        env = env_of(container)
        for key in ("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_TOKEN"):
            assert env.get(key) == head[key], f"{name}: {group} lacks the head's {key}"


def prerequisites() -> list[dict]:
    return list(yaml.safe_load_all((ROOT / "cluster" / "kuberay" / "prerequisites.yaml")
                                   .read_text()))


@pytest.mark.parametrize("name", sorted(MANIFESTS))
def test_what_the_manifests_reference_is_in_prerequisites(name):
    docs = prerequisites()
    claims = {d["metadata"]["name"]: d for d in docs if d["kind"] == "PersistentVolumeClaim"}
    secrets = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Secret"}
    spec = cluster_spec(name)
    templates = [spec["headGroupSpec"]["template"]] + [g["template"]
                                                       for g in spec["workerGroupSpecs"]]
    for template in templates:
        for volume in template["spec"].get("volumes", []):
            claim = volume.get("persistentVolumeClaim", {}).get("claimName")
            if claim:
                assert claim in claims, f"{name}: claim {claim} is not in prerequisites.yaml"
                # every node reads and writes checkpoints there
                assert claims[claim]["spec"]["accessModes"] == ["ReadWriteMany"]
        for container in template["spec"]["containers"]:
            for entry in container.get("env", []):
                ref = (entry.get("valueFrom") or {}).get("secretKeyRef")
                if ref:
                    secret = secrets.get(ref["name"])
                    assert secret is not None, f"{name}: Secret {ref['name']} is not defined"
                    assert ref["key"] in secret["stringData"] or ref.get("optional"), \
                        f"{name}: Secret {ref['name']} has no key {ref['key']}"
                assert "configMapKeyRef" not in (entry.get("valueFrom") or {}), \
                    f"{name}: a ConfigMap prerequisites.yaml does not create"


@pytest.mark.parametrize("name", sorted(MANIFESTS))
def test_token_auth_states_the_kuberay_it_needs(name):
    text = (ROOT / "cluster" / "kuberay" / name).read_text()
    assert cluster_spec(name)["authOptions"]["mode"] == "token"
    assert "KubeRay >= 1.5.1" in text and "1.4" not in text
    assert "prerequisites.yaml" in text.split("\napiVersion:")[0]  # said in the header


def test_image_torch_is_the_tested_one():
    dockerfile = (ROOT / "cluster" / "Dockerfile").read_text()
    tested = re.search(r"torch==([\d.]+)", (ROOT / ".ci" / "run").read_text()).group(1)
    assert re.search(rf"^ARG TORCH_VERSION={re.escape(tested)}$", dockerfile, re.M)
    cuda = re.search(r"^ARG CUDA_TAG=(cu\d+)$", dockerfile, re.M).group(1)
    assert re.search(rf"^ARG TORCH_CUDA={cuda}$", dockerfile, re.M)  # same CUDA
    assert "ray-ml" not in dockerfile
