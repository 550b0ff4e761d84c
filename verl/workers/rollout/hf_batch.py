"""The hf engine's running batch: requests that join and leave between decode steps (continuous batching).

All running requests share one transformers ``DynamicCache``; each row is left-padded to the batch's common cache
length and carries its own position, attention mask, stop ids, token budget and random stream. Joining requests
are prefilled on their own (identical contexts once, e.g. the ``n`` samples of a prompt) and merged into the running
cache by left-padding the shorter of the two. Finished, aborted or preempted rows become dead rows that are dropped
lazily (once they are a quarter of the batch, or at the next merge); the leading columns no row attends to are
trimmed then.

Sampling draws no process-global randomness: a request's uniforms come from a ``torch.Generator`` seeded with its
seed (``max_tokens`` of them, drawn up front), and token ``t`` of the response inverts the CDF at uniform ``t``,
whatever else shares the batch and whenever the request was resumed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from verl.workers.rollout.serving import RequestState

__all__ = ["RunningBatch", "draw_uniforms"]

Sampler = Callable[..., tuple[torch.Tensor, torch.Tensor]]


def draw_uniforms(seed: int | None, length: int) -> torch.Tensor:
    """``length`` float64 uniforms in [0, 1) from a generator seeded with ``seed`` (zeros for greedy requests)."""
    if seed is None:
        return torch.zeros(length, dtype=torch.float64)
    generator = torch.Generator(device="cpu")
    generator.manual_seed(seed)
    return torch.rand(length, generator=generator, dtype=torch.float64)


def _layers(cache: Any) -> list[Any]:
    return list(cache.layers)


def _left_pad(tensor: torch.Tensor, width: int, dim: int, value: float = 0) -> torch.Tensor:
    """Pad ``tensor`` on the left of ``dim`` to ``width``."""
    missing = width - tensor.shape[dim]
    if missing <= 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_full(shape, value), tensor], dim=dim)


def _right_pad(tensor: torch.Tensor, width: int, value: float) -> torch.Tensor:
    missing = width - tensor.shape[1]
    if missing <= 0:
        return tensor
    return torch.cat([tensor, tensor.new_full((tensor.shape[0], missing), value)], dim=1)


def prompt_position_log_probs(
    log_probs: torch.Tensor, prompt_ids: list[int], k: int
) -> tuple[list[list[int]], list[list[float]]]:
    """veRL's ``prompt_ids`` / ``prompt_logprobs`` fields from the log-softmax at every prompt position
    (``log_probs``: (len(prompt_ids), V), row i the distribution after token i): one row per prompt token, row i
    about token i given the tokens before it. ``k = 0``: ``[token i]`` and its log-prob; ``k > 0``: the top-k
    tokens and their log-probs, most likely first. Row 0 (nothing before it) is zeros (``[token 0]`` and 0.0 for
    ``k = 0``)."""
    if k == 0:
        targets = torch.tensor(prompt_ids[1:], dtype=torch.long, device=log_probs.device)
        values = log_probs[:-1].gather(-1, targets[:, None]).squeeze(-1).tolist()
        return [[t] for t in prompt_ids], [[0.0]] + [[v] for v in values]
    top = log_probs[:-1].topk(min(k, log_probs.shape[-1]), dim=-1)
    width = top.indices.shape[-1]
    return [[0] * width] + top.indices.tolist(), [[0.0] * width] + top.values.tolist()


class RunningBatch:
    """Rows of running requests and their shared KV cache, for one model.

    Args:
        model: the causal LM (eval mode).
        cache_kwarg: the forward keyword of the cache ("past_key_values" or "cache").
        sample: ``sample_tokens(logits, uniforms | None, temperature, top_k, top_p) -> (tokens, log_probs)``.
        device: where the model runs.
    """

    def __init__(self, model: torch.nn.Module, cache_kwarg: str, sample: Sampler, device: torch.device) -> None:
        self.model, self.cache_kwarg, self.sample, self.device = model, cache_kwarg, sample, device
        self._clear()

    def _clear(self) -> None:
        self.rows: list[RequestState | None] = []  # None: a dead row, dropped at the next compaction
        self.cache: Any = None
        self.mask = self.next_pos = self.logits = self.uniforms = self.count = self.limit = self.stops = None
        self._groups: list[tuple[tuple, torch.Tensor]] | None = None

    @property
    def live(self) -> int:
        return sum(row is not None for row in self.rows)

    def nbytes(self) -> int:
        """Bytes of the KV cache."""
        if self.cache is None:
            return 0
        return sum(t.numel() * t.element_size() for layer in _layers(self.cache) for t in (layer.keys, layer.values))

    # ------------------------------------------------------------------ joining and leaving
    @torch.no_grad()
    def admit(self, requests: list[RequestState]) -> None:
        """Prefill ``requests`` (prompt plus any tokens already generated) and merge them into the batch."""
        from transformers import DynamicCache

        contexts = [tuple(r.context_ids) for r in requests]
        unique = list(dict.fromkeys(contexts))
        index = {c: i for i, c in enumerate(unique)}
        width = max(len(c) for c in unique)
        ids = torch.zeros(len(unique), width, dtype=torch.long)
        mask = torch.zeros(len(unique), width, dtype=torch.long)
        for i, context in enumerate(unique):
            ids[i, width - len(context) :] = torch.tensor(context, dtype=torch.long)
            mask[i, width - len(context) :] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        try:
            cache = DynamicCache(config=self.model.config)
        except TypeError:  # older transformers
            cache = DynamicCache()
        asking = [r for r in requests if r.spec.prompt_logprobs is not None and r.prompt_logprobs is None]
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=(mask.cumsum(-1) - 1).clamp_(min=0),
            use_cache=True,
            logits_to_keep=0 if asking else 1,  # every position's logits where prompt log-probs are asked
            **{self.cache_kwarg: cache},
        )
        for r in asking:  # their first prefill is of the prompt alone (the tokens of a resumed one are not asked)
            row, length = out.logits[index[tuple(r.context_ids)]], len(r.prompt_ids)
            log_probs = torch.log_softmax(row[width - len(r.context_ids) :][:length].float(), dim=-1)
            r.prompt_logprobs = prompt_position_log_probs(log_probs, r.prompt_ids, r.spec.prompt_logprobs)
        logits = out.logits[:, -1, :].float()
        rows = torch.tensor([index[c] for c in contexts], device=self.device)
        if len(unique) != len(contexts):
            for layer in _layers(cache):
                layer.keys, layer.values = layer.keys.index_select(0, rows), layer.values.index_select(0, rows)
            logits, mask = logits.index_select(0, rows), mask.index_select(0, rows)
        length = max(r.spec.max_tokens for r in requests)
        stop_width = max(1, *(len(r.spec.stop_token_ids) for r in requests))
        stops = torch.full((len(requests), stop_width), -1, dtype=torch.long)
        for i, r in enumerate(requests):
            if not r.spec.ignore_eos and r.spec.stop_token_ids:
                stops[i, : len(r.spec.stop_token_ids)] = torch.tensor(r.spec.stop_token_ids)
        new = {
            "mask": mask,
            "next_pos": mask.sum(-1),
            "logits": logits,
            "uniforms": torch.stack(
                [_right_pad(draw_uniforms(r.spec.seed, r.spec.max_tokens)[None], length, 0.0)[0] for r in requests]
            ).to(self.device),
            "count": torch.tensor([len(r.token_ids) for r in requests], device=self.device),
            "limit": torch.tensor([r.spec.max_tokens for r in requests], device=self.device),
            "stops": stops.to(self.device),
        }
        if not self.rows:
            self.cache, self.rows = cache, list(requests)
            for key, value in new.items():
                setattr(self, key, value)
        else:
            self._compact(force=True)
            self._merge(cache, new, requests)
        self._groups = None

    def release(self, requests: list[RequestState]) -> None:
        """Stop generating for ``requests`` (their rows become dead)."""
        gone = {id(r) for r in requests}
        self.rows = [None if row is not None and id(row) in gone else row for row in self.rows]
        self._groups = None
        if not self.live:
            self._clear()

    def _merge(self, cache: Any, new: dict[str, torch.Tensor], requests: list[RequestState]) -> None:
        width = max(self.mask.shape[1], new["mask"].shape[1])
        for mine, theirs in zip(_layers(self.cache), _layers(cache), strict=True):
            mine.keys = torch.cat([_left_pad(mine.keys, width, 2), _left_pad(theirs.keys, width, 2)])
            mine.values = torch.cat([_left_pad(mine.values, width, 2), _left_pad(theirs.values, width, 2)])
        self.mask = torch.cat([_left_pad(self.mask, width, 1), _left_pad(new["mask"], width, 1)])
        length = max(self.uniforms.shape[1], new["uniforms"].shape[1])
        self.uniforms = torch.cat([_right_pad(self.uniforms, length, 0.0), _right_pad(new["uniforms"], length, 0.0)])
        stop_width = max(self.stops.shape[1], new["stops"].shape[1])
        self.stops = torch.cat([_right_pad(self.stops, stop_width, -1), _right_pad(new["stops"], stop_width, -1)])
        for key in ("next_pos", "logits", "count", "limit"):
            setattr(self, key, torch.cat([getattr(self, key), new[key]]))
        self.rows.extend(requests)

    def _compact(self, force: bool = False) -> torch.Tensor | None:
        """Drop dead rows (when forced, or once they are a quarter of the batch) and unused leading columns.
        Returns the indices of the rows kept, or None when nothing changed."""
        dead = len(self.rows) - self.live
        if not dead or (not force and dead * 4 < len(self.rows)):
            return None
        keep = torch.tensor([i for i, row in enumerate(self.rows) if row is not None], device=self.device)
        self.rows = [row for row in self.rows if row is not None]
        self.mask = self.mask.index_select(0, keep)
        first = int(self.mask.argmax(-1).min())  # leading columns no row attends to
        self.mask = self.mask[:, first:]
        for layer in _layers(self.cache):
            layer.keys = layer.keys.index_select(0, keep)[:, :, first:]
            layer.values = layer.values.index_select(0, keep)[:, :, first:]
        for key in ("next_pos", "logits", "uniforms", "count", "limit", "stops"):
            setattr(self, key, getattr(self, key).index_select(0, keep))
        self._groups = None
        return keep

    # ------------------------------------------------------------------ one decode step
    def _sampling_groups(self) -> list[tuple[tuple, torch.Tensor]]:
        """Rows grouped by sampling parameters (usually one group)."""
        if self._groups is None:
            groups: dict[tuple, list[int]] = {}
            for i, row in enumerate(self.rows):
                spec = row.spec if row is not None else None
                greedy = spec is None or spec.greedy
                key = (True, 1.0, -1, 1.0) if greedy else (False, spec.temperature, spec.top_k, spec.top_p)
                groups.setdefault(key, []).append(i)
            self._groups = [(k, torch.tensor(v, device=self.device)) for k, v in groups.items()]
        return self._groups

    def _sample(self) -> tuple[torch.Tensor, torch.Tensor]:
        rows = torch.arange(len(self.rows), device=self.device)
        position = self.count.clamp(max=self.uniforms.shape[1] - 1)
        uniforms = self.uniforms[rows, position]
        groups = self._sampling_groups()
        if len(groups) == 1:
            (greedy, temperature, top_k, top_p), _ = groups[0]
            return self.sample(self.logits, None if greedy else uniforms, temperature, top_k, top_p)
        tokens = torch.zeros(len(self.rows), dtype=torch.long, device=self.device)
        log_probs = torch.zeros(len(self.rows), device=self.device)
        for (greedy, temperature, top_k, top_p), index in groups:
            t, lp = self.sample(self.logits[index], None if greedy else uniforms[index], temperature, top_k, top_p)
            tokens[index], log_probs[index] = t, lp
        return tokens, log_probs

    @torch.no_grad()
    def step(self) -> list[tuple[RequestState, list[int], list[float], str | None]]:
        """Sample one token for every live row, then feed the batch forward. Finished rows die."""
        tokens, log_probs = self._sample()
        self.count += 1
        hit = (tokens[:, None] == self.stops).any(-1)
        over = self.count >= self.limit
        events = []
        for i, (request, token, log_prob, stop, full) in enumerate(
            zip(self.rows, tokens.tolist(), log_probs.tolist(), hit.tolist(), over.tolist(), strict=True)
        ):
            if request is None:
                continue
            finish = "stop" if stop else "length" if full else None
            events.append((request, [token], [log_prob], finish))
            if finish is not None:
                self.rows[i] = None
        if not self.live:
            self._clear()
            return events
        keep = self._compact()
        if keep is not None:
            tokens = tokens.index_select(0, keep)
        self.mask = torch.cat([self.mask, self.mask.new_ones(len(self.rows), 1)], dim=1)
        out = self.model(
            input_ids=tokens[:, None],
            attention_mask=self.mask,
            position_ids=self.next_pos[:, None],
            use_cache=True,
            **{self.cache_kwarg: self.cache},
        )
        self.logits = out.logits[:, -1, :].float()
        self.next_pos = self.next_pos + 1
        return events
