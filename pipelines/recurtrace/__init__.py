"""The RecurTrace experiment as stage bodies: its params (``params``: the ``recurtrace:`` section,
``calibrated_params``: ``recurtrace.calibrated``, ``wise_reuse``: the WISE settings its sections run
WISE under), the checkpoints and the fixed-depth table (``runs``: ``ensure_base`` /
``ensure_retrofit`` / ``ensure_table``; ``train_retrofit`` builds and trains a retrofit from the
recipe), the halting heads (``train_halting``), every depth rule on the test rows
(``halting_eval``), the calibrated case (``calibrated_cell``: one cell, ``calibrated``: the stage)
and the stages' device options (``devices``). The looped model is ``wise.models.looped``; the
library pieces it trains and reads with are ``wise.looped`` and ``wise.halting``.
"""
