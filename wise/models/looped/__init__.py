"""The looped model family: a pretrained decoder retrofitted into prelude / looped block / coda.

``base`` loads the decoder through transformers, ``config`` is the looped model's config,
``model`` the looped model (the WISE runner's protocol), ``lma`` Loop Memory Attention, ``seam``
the attention seam WISE routes through, ``checkpoint`` the retrofit folder's I/O. It sits on the
models floor beside the recurrent-depth family, so loading a retrofit needs none of the RecurTrace
experiment (``wise.looped``: recipe, training, calibrated case, fixed-depth tables).
"""
