"""Log-probs of the trained tokens of a batch of trajectories, with their shared prefix computed once.

The prefix (system prompt, tool schemas, examples) runs through the model once; its keys and values are
repeated for every row, so the gradient of every sample flows back through one prefix. Logits are computed
only at positions that predict a trained token, never for the prompt.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from toolrl.rollout.engine import common_prefix_length
from toolrl.rollout.trajectory import Trajectory


def micro_batches(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Indices into `lengths` grouped so that rows x longest length <= max_tokens, shortest first.

    `lengths` are the tokens each trajectory has beyond the prefix shared by all; sorting keeps padding small.
    A trajectory longer than the budget gets a batch of its own.
    """
    batches: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        if batches and (len(batches[-1]) + 1) * lengths[i] <= max_tokens:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def trained_token_logprobs(
    model, trajs: Sequence[Trajectory], temperature: float = 1.0
) -> tuple[torch.Tensor, list[int]]:
    """Log-probs (flat, in trajectory order) of the tokens with loss_mask 1, and the count per trajectory."""
    device = next(model.parameters()).device
    first_trained = min(t.loss_mask.index(1) for t in trajs)
    # Every scored position (first_trained - 1 onward) must lie in the suffix, after the shared prefix.
    prefix_len = min(common_prefix_length([t.token_ids for t in trajs]), first_trained - 1)
    prefix = trajs[0].token_ids[:prefix_len]
    suffixes = [t.token_ids[prefix_len:] for t in trajs]
    width = max(len(s) for s in suffixes)
    rows = len(trajs)
    ids = torch.zeros(rows, width, dtype=torch.long)
    suffix_mask = torch.zeros(rows, width, dtype=torch.long)
    for i, s in enumerate(suffixes):
        ids[i, : len(s)] = torch.tensor(s)
        suffix_mask[i, : len(s)] = 1
    ids, suffix_mask = ids.to(device), suffix_mask.to(device)

    decoder = model.get_decoder()
    cache = None
    if prefix_len:
        cache = decoder(input_ids=torch.tensor([prefix], device=device), use_cache=True).past_key_values
        cache.batch_repeat_interleave(rows)
    attention = torch.cat([torch.ones(rows, prefix_len, dtype=torch.long, device=device), suffix_mask], dim=1)
    positions = torch.arange(prefix_len, prefix_len + width, device=device).expand(rows, -1)
    hidden = decoder(
        input_ids=ids,
        attention_mask=attention,
        position_ids=positions,
        past_key_values=cache,
        use_cache=cache is not None,
    ).last_hidden_state

    rows_idx, cols_idx, targets, counts = [], [], [], []
    for i, t in enumerate(trajs):
        trained = [p for p, m in enumerate(t.loss_mask) if m]
        rows_idx += [i] * len(trained)
        cols_idx += [p - 1 - prefix_len for p in trained]
        targets += [t.token_ids[p] for p in trained]
        counts.append(len(trained))
    selected = hidden[torch.tensor(rows_idx, device=device), torch.tensor(cols_idx, device=device)]
    logits = model.get_output_embeddings()(selected).float()
    if temperature > 0:
        logits = logits / temperature
    logp = torch.log_softmax(logits, dim=-1)
    return logp.gather(1, torch.tensor(targets, device=device)[:, None]).squeeze(1), counts
