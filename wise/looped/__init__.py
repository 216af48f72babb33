"""RecurTrace: retrofit a pretrained decoder into a looped reasoner with Loop Memory Attention.

``base`` loads the decoder through transformers, ``model`` is the looped model (the WISE runner's
protocol), ``lma`` the loop memory, ``seam`` the attention seam, ``probe`` the block choice,
``depth`` the loop-count sampler, ``checkpoint`` the retrofit checkpoint I/O, ``train`` /
``base_train`` the training loops, ``evaluate`` the fixed-depth table.
"""
