"""The real-model study: a pretrained decoder (SmolLM2-135M-Instruct, shipped by a pip package as GGUF)
retrofitted with RecurTrace and measured on real text. Stage bodies: corpus (real_corpus), train
(train_real_retrofit), evaluation and halting (real_eval), wise_study and wise_summary (real_wise);
model.py holds what they share, gpu_study.py the GPU study's tables for the report."""
