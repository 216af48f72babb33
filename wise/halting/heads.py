"""Linear halting heads on the pooled block state, and how each is trained on a frozen model.

Every head is p = σ(wᵀ ẑ + b) with ẑ = (z − μ) / σ standardised by the training set's per-feature
mean and std (fixed buffers: an affine reparametrisation of wᵀz + b that keeps full-batch Adam
well conditioned on raw hidden states). w and b start at zero and train full batch, so training is
a deterministic function of the data. Only the head trains; the trajectories (and so the base and
the LMA) are fixed inputs.

- ``fit_halting`` (RecurTrace, oracle-distilled): p_t is the probability of *continuing* after
  loop t, fitted by binary cross-entropy to the loss-improvement oracle's labels
  ``oracle_labels``: y_t = 1[min_{t'>t} L_t' < L_t − δ], on the loops where the head is consulted
  (t_min ≤ t < t_max).
- ``fit_act`` (Graves 2016, Adaptive Computation Time): h_t is the halting unit; N = the first n
  with Σ_{t≤n} h_t ≥ 1 − ε (or t_max), remainder R = 1 − Σ_{t<N} h_t, weights p_t = h_t (t < N),
  p_N = R. Loss: the NLL of the mean-field output mixture Σ_t p_t P_t(y_k) of each gold token,
  plus ponder_cost · (N + R) (its gradient flows through R, N is piecewise constant).
- ``fit_pondernet`` (Banino et al. 2021): λ_t the halting probability of loop t (λ_{t_max} = 1),
  p_t = λ_t Π_{j<t}(1 − λ_j); loss Σ_t p_t L_t + β · KL(p ‖ geometric(λ_p) truncated at t_max).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch import nn

HEADS = ("halting", "act", "pondernet")


class LinearHead(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.register_buffer("mean", torch.zeros(hidden))
        self.register_buffer("std", torch.ones(hidden))
        self.weight = nn.Parameter(torch.zeros(hidden))
        self.bias = nn.Parameter(torch.zeros(()))

    def standardise_from(self, z: torch.Tensor) -> "LinearHead":
        """Fix μ and σ from training states z [..., hidden] (σ floored so a constant feature is 0)."""
        flat = z.reshape(-1, z.shape[-1]).double()
        with torch.no_grad():
            self.mean.copy_(flat.mean(0).float())
            self.std.copy_(flat.std(0, unbiased=False).clamp_min(1e-6).float())
        return self

    def logit(self, z: torch.Tensor) -> torch.Tensor:
        """z [..., hidden] -> [...]"""
        return ((z - self.mean) / self.std) @ self.weight + self.bias

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.logit(z))


def oracle_labels(losses, delta: float) -> list[int]:
    """y_t for t = 1..T−1 of one example's answer losses L_1..L_T: 1 iff a later loop's loss is
    more than δ below L_t (continuing helps). Loop T has no later loop (the budget): no label."""
    L = [float(x) for x in losses]
    if len(L) < 2:
        raise ValueError("oracle labels need at least two loops")
    if delta < 0:
        raise ValueError(f"delta must be >= 0, got {delta}")
    return [int(min(L[t + 1:]) < L[t] - delta) for t in range(len(L) - 1)]


def _adam_fit(head: LinearHead, loss_fn, steps: int, lr: float, l2: float) -> list[float]:
    opt = torch.optim.Adam([head.weight, head.bias], lr=lr)
    curve = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        task = loss_fn(head)
        loss = task + l2 * head.weight.square().sum()
        loss.backward()
        opt.step()
        curve.append(float(task.detach()))
    return curve


def fit_halting(z: torch.Tensor, nll: torch.Tensor, t_min: int, delta: float, steps: int, lr: float,
                l2: float) -> tuple[LinearHead, dict]:
    """z [N, T, hidden], nll [N, T] (T = t_max loops). Trains on loops t_min..T−1."""
    N, T, hidden = z.shape
    if not 1 <= t_min < T:
        raise ValueError(f"need 1 <= t_min < t_max, got t_min={t_min}, t_max={T}")
    labels = torch.tensor([oracle_labels(row, delta) for row in nll.tolist()], dtype=torch.float32)  # [N, T-1]
    x = z[:, t_min - 1:T - 1]  # loops t_min..T-1
    y = labels[:, t_min - 1:]
    head = LinearHead(hidden).standardise_from(z)
    bce = nn.BCEWithLogitsLoss()
    curve = _adam_fit(head, lambda h: bce(h.logit(x), y), steps, lr, l2)
    with torch.no_grad():
        acc = float(((head.logit(x) > 0).float() == y).float().mean())
    return head, {"rows": int(y.numel()), "positive_rate": float(y.mean()), "loss_first": curve[0],
                  "loss_last": curve[-1], "train_label_accuracy": acc}


def act_weights(h: torch.Tensor, epsilon: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """h [N, T] halting units -> (p [N, T] the ACT weights, N [N] halting loop (1-based),
    R [N] remainder). The last loop is the budget: N <= T."""
    n, T = h.shape
    cum = h.cumsum(1)
    reached = cum >= 1 - epsilon
    reached[:, -1] = True
    N = reached.float().argmax(1) + 1  # first loop reaching 1 - eps
    steps = torch.arange(1, T + 1, device=h.device)[None]
    before = steps < N[:, None]
    R = 1 - (h * before).sum(1)
    p = torch.where(before, h, torch.zeros_like(h)) + torch.where(steps == N[:, None], R[:, None], torch.zeros_like(h))
    return p, N, R


def fit_act(z: torch.Tensor, gold_logprob: torch.Tensor, mask: torch.Tensor, epsilon: float, ponder_cost: float,
            steps: int, lr: float, l2: float) -> tuple[LinearHead, dict]:
    """z [N, T, hidden], gold_logprob [N, T, A] with mask [N, A]."""
    head = LinearHead(z.shape[-1]).standardise_from(z)
    m = mask.float()

    def loss(hd: LinearHead) -> torch.Tensor:
        p, N, R = act_weights(hd(z), epsilon)
        mix = torch.logsumexp(torch.log(p.clamp_min(1e-30))[:, :, None] + gold_logprob, dim=1)  # [N, A]
        task = -(mix * m).sum(1) / m.sum(1)
        return (task + ponder_cost * (N.float() + R)).mean()

    curve = _adam_fit(head, loss, steps, lr, l2)
    with torch.no_grad():
        _, N, _ = act_weights(head(z), epsilon)
    return head, {"loss_first": curve[0], "loss_last": curve[-1], "train_mean_loops": float(N.float().mean())}


def pondernet_weights(lam: torch.Tensor) -> torch.Tensor:
    """λ [N, T] -> p [N, T], the probability of halting at each loop (λ_T forced to 1)."""
    lam = torch.cat([lam[:, :-1], torch.ones_like(lam[:, -1:])], 1)
    survive = torch.cumprod(torch.cat([torch.ones_like(lam[:, :1]), 1 - lam[:, :-1]], 1), 1)
    return lam * survive


def geometric_prior(prior: float, T: int) -> torch.Tensor:
    """[T]: λ_p (1 − λ_p)^(t−1), truncated at T and renormalised."""
    t = torch.arange(T, dtype=torch.float64)
    g = prior * (1 - prior) ** t
    return (g / g.sum()).float()


def fit_pondernet(z: torch.Tensor, nll: torch.Tensor, beta: float, prior: float, steps: int, lr: float,
                  l2: float) -> tuple[LinearHead, dict]:
    head = LinearHead(z.shape[-1]).standardise_from(z)
    log_prior = geometric_prior(prior, z.shape[1]).log()[None]

    def loss(hd: LinearHead) -> torch.Tensor:
        p = pondernet_weights(hd(z))
        rec = (p * nll).sum(1)
        kl = (p * (torch.log(p.clamp_min(1e-30)) - log_prior)).sum(1)
        return (rec + beta * kl).mean()

    curve = _adam_fit(head, loss, steps, lr, l2)
    with torch.no_grad():
        p = pondernet_weights(head(z))
        expected = float((p * torch.arange(1, z.shape[1] + 1)).sum(1).mean())
    return head, {"loss_first": curve[0], "loss_last": curve[-1], "train_expected_loops": expected}


# -- the heads folder ------------------------------------------------------------------------------
WEIGHTS = "heads.safetensors"
CARD = "halting.json"


def save_heads(heads: dict[str, LinearHead], card: dict, folder: str | os.PathLike) -> Path:
    from safetensors.torch import save_file

    from wise.atomic_files import atomic_path

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {f"{name}.{k}": v.detach().float().contiguous().cpu() for name, h in heads.items()
             for k, v in h.state_dict().items()}
    with atomic_path(folder / WEIGHTS) as tmp:
        save_file(state, str(tmp))
    with atomic_path(folder / CARD) as tmp:
        tmp.write_text(json.dumps(card, indent=2, sort_keys=True) + "\n")
    return folder


def load_heads(folder: str | os.PathLike) -> tuple[dict[str, LinearHead], dict]:
    from safetensors.torch import load_file

    folder = Path(folder)
    for name in (WEIGHTS, CARD):
        if not (folder / name).is_file():
            raise FileNotFoundError(f"halting heads folder {folder} has no {name}: "
                                    "run the recurtrace_train_halting stage")
    state = load_file(str(folder / WEIGHTS))
    heads = {}
    for name in HEADS:
        part = {k.split(".", 1)[1]: v for k, v in state.items() if k.startswith(name + ".")}
        if not part:
            raise KeyError(f"{folder / WEIGHTS}: no tensors of head {name!r}")
        head = LinearHead(part["weight"].shape[0])
        head.load_state_dict(part, strict=True)
        heads[name] = head.eval()
    return heads, json.loads((folder / CARD).read_text())
