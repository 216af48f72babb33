"""Stage `validate`: check the whole params file before any other stage runs.

DVC deletes a stage's outputs before it runs the stage, so a bad value found by the stage itself
would already have cost its outputs. Every other stage lists this stage's stamp as a dependency,
so DVC runs this one first whenever params.yaml changed, and a bad value stops `dvc repro` here,
naming the key, with every file under data/ untouched. The stamp is a persistent output (DVC never
deletes it) and its content is constant, so a params edit reruns only the stages that read the
edited keys. Checked: every section and key of pipelines.config.params (present, typed, in range, the
relations between keys), the names and rules the library defines (pipelines.config.library_checks:
conditions, benchmarks, the adaptive and exit rules), the model's positions and the kernel backend
where the model can be read now (the calibration model is checked from `calibration:`, which
builds it later), `train:` (every key of wise.training.TrainConfig, as the train_backbone stage
reads it) and `recurtrace:` (every key of pipelines.recurtrace.params.RetrofitParams, as the
RecurTrace stages read it), and before any work: model.source a local folder with config.json and
tokenizer.json (a preset or a hub id has none; pipelines.config.model_source), and
(pipelines.config.preflight) the compute request against this machine, the model's weight files
(not truncated), and every context length against the generated benchmarks' prompts.
"""
import argparse
import sys
from pathlib import Path

import yaml

from pipelines.config import paths
from pipelines.store.artifacts import write_text
from pipelines.config.library_checks import check_context_lengths, check_params_file, prompt_tokenizer
from pipelines.config.params import ParamsError
from pipelines.config.preflight import check_compute_here, check_weights
from pipelines.config.model_source import validate_dvc_model_source
from pipelines.recurtrace.params import parse_retrofit
from wise.training.config import TrainConfig

STAMP_TEXT = ("params checked by stages/validate.py before any other stage ran; the content never "
              "changes, so this file reruns nothing downstream\n")


def check_train(raw: dict, where: str) -> None:
    """`train:` (the train_backbone stage): every key given, typed and in range."""
    try:
        TrainConfig.from_dict(raw.get("train"), complete=True)
    except (TypeError, ValueError) as exc:
        raise ParamsError(f"{where}: {exc}") from None


def check_retrofit(raw: dict, where: str) -> None:
    """`recurtrace:` (the RecurTrace stages): every key given, typed and in range."""
    parse_retrofit(raw, where)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m stages.validate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="params.yaml", help="params file (default: params.yaml)")
    args = ap.parse_args(argv)
    try:
        raw = yaml.safe_load(Path(args.params).read_text()) or {}
        source = (raw.get("model") or {}).get("source") if isinstance(raw, dict) else None
        # Folders this pipeline writes after this stage (build_calibration, recurtrace_train@*) are
        # checked from their own sections instead.
        name = ((raw.get("recurtrace") or {}).get("name") if isinstance(raw, dict) else None) or ""
        built = {paths.CALIBRATION_MODEL, *(Path("data/models") / f"{name}-{v}" for v in ("lma", "plain"))}
        check_model = source is not None and Path(str(source)) not in built
        params = check_params_file(args.params, check_model=check_model)
        if check_model:  # a folder, as dvc.yaml's ${model.source} dependencies need (no preset, no hub id)
            validate_dvc_model_source(params.model.source, args.params)
        check_train(raw, args.params)
        check_retrofit(raw, args.params)
        check_compute_here(params)
        if check_model:
            check_weights(params.model.source)
        tok = prompt_tokenizer(params)
        if tok is not None:
            check_context_lengths(params, tok)
    except (ParamsError, FileNotFoundError, yaml.YAMLError) as exc:
        print(f"validate: {exc}", file=sys.stderr)
        return 2
    write_text(STAMP_TEXT, paths.PARAMS_STAMP)
    print(f"validate: {args.params} is complete and valid -> {paths.PARAMS_STAMP}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
