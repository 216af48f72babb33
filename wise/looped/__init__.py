"""RecurTrace: retrofit a pretrained decoder into a looped reasoner with Loop Memory Attention.

``base`` loads the decoder through transformers, ``config`` is the looped model's config and
``model`` the looped model (the WISE runner's protocol), ``lma`` the loop memory, ``seam`` the
attention seam, ``probe`` the block choice, ``depth`` the loop-count sampler, ``checkpoint`` the
retrofit checkpoint I/O, ``train`` the training loops (the embedded base's and the retrofits'),
``evaluate`` and ``runs`` the fixed-depth table, ``recipe`` the typed params. The calibrated case:
``chain_base`` (the constructed Llama base), ``known_depth`` (its items), ``calibration`` (their
expected values), ``known_runs`` (batched trajectories), ``latch`` (the LMA retrofit trained on the
CPU), ``calibrate`` (one cell: ``python -m wise.looped.calibrate``), ``calibration_params``.
"""
