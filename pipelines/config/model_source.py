"""``model.source`` checked before any work, each bad source in one line that says what to name instead.

- ``check_model_source`` (every stage, through ``load_params``): a ``preset:<name>[@<seed>]`` source
  names a known preset (an unknown name lists every preset: the architectures, the constructed
  ``wise-chain`` and the packaged pretrained decoders) of a looped model (a packaged decoder does
  not loop).
- ``validate_dvc_model_source`` (the DVC stage ``validate``): ``dvc repro`` needs a local folder,
  because dvc.yaml depends on ``${model.source}`` and on its ``config.json`` and ``tokenizer.json``,
  and the stages run offline. A preset or a hub id names no such folder, so it is refused there,
  before any stage has written anything.
"""
from __future__ import annotations

from pathlib import Path

from pipelines.config.validate import ParamsError

DVC_MODEL_FILES = ("config.json", "tokenizer.json")  # dvc.yaml's ${model.source}/... dependencies


def check_model_source(source: str) -> None:
    """A preset source names a looped model's preset; other sources are checked where they are read."""
    from wise.models.config import CHAIN_PRESET, PRESETS

    if source.startswith("preset:") and _preset(source)[0] not in (*PRESETS, CHAIN_PRESET):
        raise plain_decoder_error(source)


def _preset(source: str) -> tuple[str, int]:
    from wise.models.config import parse_preset

    try:
        return parse_preset(source)
    except ValueError as exc:
        raise ParamsError(f"params.yaml: model.source = {source!r}: {exc}") from None


def plain_decoder_error(source: str) -> ParamsError:
    """A packaged pretrained decoder named as the pipeline's model: it does not loop."""
    return ParamsError(f"params.yaml: model.source = {source!r}: a pretrained decoder without loops; the stages "
                       "run a looped model, e.g. its LMA retrofit data/models/<real_model.name>-lma "
                       "(stage train_real_retrofit@lma)")


def validate_dvc_model_source(source: str, params_file: str = "params.yaml") -> None:
    """model.source as `dvc repro` reads it: a local folder holding config.json and tokenizer.json;
    errors name `params_file`."""
    try:
        _check_folder_source(source)
    except ParamsError as exc:
        raise ParamsError(str(exc).replace("params.yaml:", f"{params_file}:", 1)) from None


def _check_folder_source(source: str) -> None:
    from wise.models.checkpoint import is_hub_id
    from wise.models.config import CHAIN_PRESET, PRESETS

    where = f"params.yaml: model.source = {source!r}"
    if source.startswith("preset:"):
        name, seed = _preset(source)
        if name == CHAIN_PRESET:
            instead = "name data/models/wise-chain, which stage build_calibration writes"
        elif name in PRESETS:
            instead = (f"write one (python -m wise.models.make_random --preset {name} --seed {seed} "
                       f"--out data/models/{name}) "
                       f"or run the preset outside DVC (python -m pipelines.dryrun --source {source})")
        else:
            raise plain_decoder_error(source)
        raise ParamsError(f"{where}: a preset has no folder, and dvc.yaml depends on "
                          f"${{model.source}}/tokenizer.json; {instead}")
    if is_hub_id(source):
        raise ParamsError(f"{where}: a hub id has no local folder, and dvc.yaml depends on "
                          "${model.source}/tokenizer.json while the stages run offline; download it once "
                          f"(huggingface-cli download {source} --local-dir data/models/{source.split('/')[-1]}) "
                          "and name that folder")
    folder = Path(source)
    if not folder.is_dir():
        raise ParamsError(f"{where}: no such folder")
    missing = [name for name in DVC_MODEL_FILES if not (folder / name).is_file()]
    if missing:
        raise ParamsError(f"{where}: no {' and no '.join(missing)} in the folder, which dvc.yaml's stages depend on")
