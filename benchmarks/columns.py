"""The columns benchmarks.bench measures, by name only (no imports). The timing stage's Parquet
schema (pipelines.config.schemas.TIMING_MEASURED) lists the same names, in this order, without
importing this module (parsing params imports no benchmark code); tests/test_timing_stage.py checks
that the two lists are equal."""

# Every measured column, NaN until measured (planned rows hold exactly these, plus the metadata).
MEASURED_KEYS = [
    "density", "active_blocks", "useful_gflop", "dense_gflop", "flash_ms", "cudnn_ms",
    "kernel_ms", "kernel_graph_ms", "build_ms", "build_graph_ms", "reuse20_ms",
    "flash20_ms", "cudnn20_ms", "traj32_flash_ms", "traj32_cudnn_ms", "full_kernel_ms",
    "flex_ms", "flex_build_ms", "call_vs_flash", "call_vs_cudnn", "reuse20_vs_flash",
    "reuse20_vs_cudnn", "traj32_vs_flash", "traj32_vs_cudnn", "full_vs_wise_same_backend",
    "full_vs_flash", "flex_vs_flash", "kernel_vs_flex", "flash_tflops", "cudnn_tflops",
    "kernel_tflops", "full_kernel_tflops", "flex_tflops", "rel_err_kernel",
    "rel_err_full", "rel_err_flex", "kernel_global_ms", "group_vs_global", "timing_spread"]
PREPARED_KEYS = ["prep_ms", "kernel_cap_ms", "prep_build_ms", "prep_build_cap_ms", "prep_reuse20_ms",
                 "prep_reuse20_cap_ms", "prep_call_vs_flash", "prep_call_vs_cudnn", "prep_reuse20_vs_flash",
                 "prep_reuse20_vs_cudnn", "prep_reuse20_cap_vs_flash", "prep_reuse20_cap_vs_cudnn",
                 "prep_traj32_vs_flash", "prep_traj32_vs_cudnn", "cap_vs_sorted_kernel", "prep_fast_calls",
                 "rel_err_prepared", "rel_err_prepared_cap"]
