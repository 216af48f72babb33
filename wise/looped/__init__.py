"""RecurTrace's library pieces: what retrofitting a pretrained decoder into a looped reasoner
trains and reads with. The looped model itself (decoder loading, config, model, loop memory,
attention seam, checkpoint I/O) is ``wise.models.looped``; the experiment's stage bodies (params,
runs, the calibrated case) are ``pipelines.recurtrace``.

``probe`` the block choice, ``depth`` the loop-count sampler, ``data`` / ``text_task`` the batch
streams, ``training_config`` the training recipes, ``train`` the looped family's training loop and
the embedded base, ``fixed_depth`` the fixed-depth table. The calibrated case: ``chain_base`` (the
constructed Llama base), ``known_depth`` (its items), ``calibrated_expectations`` (their expected
values), ``latch`` (the LMA retrofit trained on the CPU); their batched loop trajectories are
``wise.halting.batched_trajectories``. Nothing here imports ``wise.halting`` (it reads this package's rows).
"""
