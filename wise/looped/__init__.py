"""RecurTrace: retrofit a pretrained decoder into a looped reasoner with Loop Memory Attention.

The looped model itself (decoder loading, config, model, loop memory, attention seam, checkpoint
I/O) is ``wise.models.looped``; this package is the experiment around it: ``probe`` the block
choice, ``depth`` the loop-count sampler, ``train`` the training loops (the embedded base's and the
retrofits'), ``evaluate`` and ``runs`` the fixed-depth table, ``recipe`` the typed params. The
calibrated case: ``chain_base`` (the constructed Llama base), ``known_depth`` (its items),
``calibration`` (their expected values), ``known_runs`` (batched trajectories), ``latch`` (the LMA
retrofit trained on the CPU), ``calibrate`` (one cell: ``python -m wise.looped.calibrate``),
``calibration_params``.
"""
