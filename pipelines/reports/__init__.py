"""The report writers: the paper tables and figures, calibration / adaptive / timing sections, the
study tables, the paper's reference numbers and the constructed model's expected values."""
