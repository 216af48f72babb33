"""Adaptive depth on a retrofitted looped model (RecurTrace part 2): one depth per example.

``trajectory`` runs a row through loops 1..T_max and keeps what every depth rule reads after each
loop (the pooled block state, the answer's loss, correctness, confidence, predicted tokens);
``batched_trajectories`` does the same for thousands of known-depth rows in right-padded batches;
``heads`` holds the linear halting heads (oracle-distilled, ACT, PonderNet) and their training;
``rules`` the depth rules (fixed, the halting head, CALM confidence, ACT, PonderNet, the stability
rule (token mismatch, no gold) and the correctness oracle), replayed on trajectories or driven loop
by loop, and the held-out threshold selection; ``online`` runs a rule loop by loop for wall time and
WISE under adaptive depth (through ``wise.engine.runner``); ``depth_tables`` the per-method summary,
McNemar and depth vs difficulty."""
