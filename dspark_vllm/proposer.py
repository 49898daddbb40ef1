"""DSpark proposer for vLLM's V1 model runner: only the difference from V1 DFlash.

  * anchor-as-first block: K query slots [anchor, mask x (K-1)], every slot a prediction
    (DFlash uses 1 + K slots and samples only the masks);
  * the drafter's fc runs on the concatenated target layers (V1 applies it only for
    method "dflash");
  * sequential transition-head sampling, left to right, greedy or probabilistic, with the
    draft probabilities exact verification needs at temperature > 0;
  * per-token confidences sigmoid(w^T [h_k; W1[x_{k-1}]] / T_k) kept for the scheduler;
  * steps that draft nothing owe the drafter's context K/V instead of writing it
    (context_debt.py): written in one batched pass when a block will read it;
  * with DSPARK_PROMPT_LOOKUP set, prompt lookup beside the drafter: a request verifies
    the block its context already holds where that is expected to be accepted further
    (lookup.py).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time

import numpy as np
import torch
from vllm.v1.sample.metadata import SamplingMetadata
from vllm.v1.spec_decode.dflash import DFlashProposer

from . import lookup
from .block_graph import BlockGraphs
from .config import DEFER_ENV, GRAPHS_ENV, HEAP_TRIM_ENV, LOOKUP_ENV
from .context_debt import ContextDebt, Rows
from .heap import HeapTrimmer
from .sequential import GREEDY_EPS, sample_block

log = logging.getLogger("vllm.dspark.proposer")


@contextlib.contextmanager
def _presented_as_dflash(spec_config):
    """DFlashProposer.__init__ asserts method == "dflash"; everything it builds (buffers,
    the non-causal draft attention config, the input-expansion kernel warm-up) is exactly
    what DSpark needs, so construct it under that name and restore "dspark" at once."""
    spec_config.method = "dflash"
    try:
        yield
    finally:
        spec_config.method = "dspark"


class DSparkProposer(DFlashProposer):
    def __init__(self, vllm_config, device: torch.device, runner=None) -> None:
        hf = vllm_config.speculative_config.draft_model_config.hf_config
        # The V1 runner reads the target layers to capture from this key (DFlash's +1
        # semantics: id i = output of layer i = input of layer i + 1).
        hf.eagle_aux_hidden_state_layer_ids = [i + 1 for i in hf.target_layer_ids]
        with _presented_as_dflash(vllm_config.speculative_config):
            super().__init__(vllm_config, device, runner)
        self.method = "dspark"
        k = self.num_speculative_tokens
        self._sample_rows = torch.arange(self.max_batch_size * k, dtype=torch.int64, device=device)
        temps = getattr(hf, "dspark_confidence_temperatures", None) or [1.0] * k
        self._conf_temps = torch.tensor(temps, dtype=torch.float32, device=device)
        # On a GPU the sequential stage replays from CUDA graphs, unless the user asked vLLM
        # for eager execution or DSPARK_BLOCK_GRAPHS=0 (block_graph.py; on a CPU it always
        # runs eagerly).
        graphs = not vllm_config.model_config.enforce_eager and \
            os.environ.get(GRAPHS_ENV, "1") == "1"  # validated in config.py
        self._block_graphs = BlockGraphs() if graphs else None
        self.last_confidences: torch.Tensor | None = None  # [B, K] for the scheduler
        self.last_draft_seconds = 0.0  # wall time of the last propose() (phase metrics)
        self._runner = runner  # its input batch names the requests behind each context row
        self.debt = ContextDebt()
        self._defer = os.environ.get(DEFER_ENV, "1") == "1"  # validated in config.py
        # Prefix cache on: a departed request's blocks may be read again (write its rows);
        # off: nothing reads them (drop its rows).
        self._keep_departed = bool(vllm_config.cache_config.enable_prefix_caching)
        self.context_rows_written = 0  # rows the drafter's context K/V pass has computed
        self.context_rows_dropped = 0  # owed rows of departed requests nothing will read
        # New row counts every step churn the CPU matmuls' primitives; on request, give the
        # holes they leave back (heap.py).
        self._heap = HeapTrimmer() if device.type == "cpu" and \
            os.environ.get(HEAP_TRIM_ENV, "0") == "1" else None  # validated in config.py
        # Prompt lookup (validated in config.py: a confidence head and a measured table).
        self._lookup_max = int(os.environ.get(LOOKUP_ENV, "0"))
        self._lookup_table = getattr(hf, "dspark_lookup_acceptance", None) \
            if self._lookup_max else None
        self._sampled: torch.Tensor | None = None  # [B, K + 1] this step's verdict, -1 rejected
        self._greedy_conf: torch.Tensor | None = None  # [B, K] what lookup's choice reads
        self._row_sampled: np.ndarray | None = None  # [B] bool: samples at temperature > 0
        self._lookup_sampled = getattr(hf, "dspark_lookup_acceptance_sampled", None)
        self._discard: torch.Tensor | None = None  # [B] bool: no token sampled (partial prefill)
        self.lookup_blocks = 0  # requests that verified the lookup block, so far

    def model_returns_tuple(self) -> bool:
        return False  # the DFlash-style backbone returns one hidden-state tensor

    # ------------------------------------------------------------------ inputs
    def propose(self, num_speculative_tokens: int, *, target_hidden_states: torch.Tensor,
                common_attn_metadata, **kwargs) -> torch.Tensor:
        """target_hidden_states: [T, n_layers * H], the target layers this step captured."""
        t0 = time.perf_counter()
        req_ids = self._req_ids(common_attn_metadata.batch_size())
        self._settle_departed(req_ids)
        if num_speculative_tokens == 0:
            out = self._context_only(target_hidden_states, req_ids,
                                     common_attn_metadata=common_attn_metadata, **kwargs)
        else:
            self._write(self.debt.take())  # the blocks attend to the whole context
            # [T, n_layers * H] -> [T, H] via the drafter's fc.
            hidden = self.model.combine_hidden_states(target_hidden_states)
            self.context_rows_written += hidden.shape[0]
            out = super().propose(num_speculative_tokens, target_hidden_states=hidden,
                                  common_attn_metadata=common_attn_metadata, **kwargs)
            if self._lookup_table is not None and self._sampled is not None:
                self._splice_lookup(out)
        self._sampled = None
        self.last_draft_seconds = time.perf_counter() - t0
        if self._heap is not None:
            self._heap.maybe_trim()
        return out

    # ------------------------------------------------------------ prompt lookup
    def prepare_next_token_ids_padded(self, sampled_token_ids, requests, gpu_input_batch,
                                      discard_request_mask):
        """The runner calls this just before propose() with the step's sampled tokens
        [B, K + 1] (-1 where rejected): keep them, lookup's context ends with them."""
        self._sampled, self._discard = sampled_token_ids, discard_request_mask
        return super().prepare_next_token_ids_padded(sampled_token_ids, requests,
                                                     gpu_input_batch, discard_request_mask)

    def _splice_lookup(self, drafts: torch.Tensor) -> None:
        """drafts: [B, K] the drafter's block -> the lookup block where it is expected to be
        accepted further. Each request's context: the tokens its input batch row holds
        (prompt and every earlier output; synchronous scheduling appends this step's only
        after drafting) and this step's accepted tokens."""
        if self.last_confidences is None or self._runner is None:
            return
        batch = self._runner.input_batch
        b = drafts.shape[0]
        sampled = self._sampled[:b].cpu().numpy()
        discard = self._discard[:b].cpu().numpy()
        contexts = []
        for i in range(b):
            new = sampled[i][sampled[i] >= 0]
            n = int(batch.num_tokens_no_spec[i])
            contexts.append(None if discard[i] or not len(new) else
                            np.concatenate([batch.token_ids_cpu[i, :n], new]))
        probs = self._last_draft_probs
        self.lookup_blocks += lookup.splice_block(
            drafts, self.last_confidences, None if probs is None else probs[:b], contexts,
            self._lookup_table, max_n=self._lookup_max, decide=self._greedy_conf,
            sampled_rows=self._row_sampled, sampled_table=self._lookup_sampled)

    def _req_ids(self, batch_size: int) -> list[str]:
        if self._runner is None:  # built outside a model runner: no names, one anonymous owner
            return ["?"] * batch_size
        return list(self._runner.input_batch.req_ids[:batch_size])

    def _settle_departed(self, req_ids: list[str]) -> None:
        departed = self.debt.owners().difference(req_ids)
        if departed and self._keep_departed:  # only full blocks stay in the prefix cache
            self.context_rows_dropped += self.debt.drop_partial_blocks(departed, self.block_size)
            self._write(self.debt.take(departed))
        elif departed:
            self.context_rows_dropped += self.debt.discard(departed)

    def _write(self, rows: Rows | None) -> None:
        """The context K/V pass over owed rows: fc, then every layer's K/V into its cache."""
        if rows is None:
            return
        hidden = self.model.combine_hidden_states(rows.feats)  # [n, H]
        self.model.precompute_and_store_context_kv(hidden, rows.positions, rows.slots)
        self.context_rows_written += hidden.shape[0]

    def _context_only(self, feats: torch.Tensor, req_ids: list[str], *, target_positions,
                      common_attn_metadata, **_) -> torch.Tensor:
        """The scheduler asked for no drafts this step (budget 0 under load): record the
        context rows this step owes the drafter (context_debt.py) and skip the pass.
        feats: [T, n_layers * H] -> draft ids [B, 0]."""
        self.num_speculative_tokens = 0
        self.last_confidences = None
        self._last_draft_probs = None
        cad = common_attn_metadata
        bounds = cad.query_start_loc_cpu[: len(req_ids) + 1]
        positions, slots = self._context_slots(target_positions, cad, bounds)
        self.debt.record(req_ids, bounds.tolist(), Rows(feats, positions, slots))
        if self.debt.over_limit() or not self._defer:
            self._write(self.debt.take())
        return torch.empty((cad.batch_size(), 0), dtype=torch.int64, device=feats.device)

    def _context_slots(self, target_positions, cad, bounds):
        """Positions and drafter cache slots of a step's context rows, without building the
        query half a step with no drafts never runs. bounds: [B + 1] CPU row offsets ->
        ([n], [n]) copies (the engine reuses its buffers) for the n = bounds[-1] rows the
        requests own. The runner builds `cad` for the drafter's KV-cache group
        (drafter.kv_cache_gid), so its slot mapping is the drafter's: the slot DFlash's
        input kernel computes for position p of request r, block_table[r, p // block_size]
        * block_size + p % block_size (computing that here cost ~0.2 ms a step at 16
        requests, benchmarks/engine_profile.py k0; tests/context_debt_check.py compares)."""
        n = int(bounds[-1])
        pos = target_positions[:n].to(torch.int64, copy=True)  # [n]
        return pos, cad.slot_mapping[:n].to(torch.int64, copy=True)

    def set_inputs_first_pass(self, target_token_ids, next_token_ids, target_positions,
                              target_hidden_states, token_indices_to_sample, cad,
                              num_rejected_tokens_gpu):
        # DFlash lays out 1 + n query slots per request; with n = K - 1 its fused kernel
        # writes exactly the anchor-as-first block: [anchor, mask x (K-1)] at positions
        # last_verified + 1 .. + K. At least one slot runs even when K = 0 (dynamic
        # speculation) so the context K/V for the next round still gets written.
        k = max(self.num_speculative_tokens, 1)
        saved = self.num_speculative_tokens
        self.num_speculative_tokens = k - 1
        try:
            num_tokens, _, new_cad = super().set_inputs_first_pass(
                target_token_ids, next_token_ids, target_positions, target_hidden_states,
                token_indices_to_sample, cad, num_rejected_tokens_gpu)
        finally:
            self.num_speculative_tokens = saved
        # Every slot is a prediction (slot j predicts the token at anchor_pos + j + 1).
        return num_tokens, self._sample_rows[:num_tokens], new_cad

    # ---------------------------------------------------------------- sampling
    def _sample_draft_tokens(self, hidden_states: torch.Tensor,
                             sampling_metadata: SamplingMetadata):
        """hidden_states: [B*K, H] backbone outputs, request-major -> ([B*K], [B*K, V] | None)."""
        k = self.num_speculative_tokens
        b = hidden_states.shape[0] // k
        probabilistic = self._enable_probabilistic_draft_probs and not sampling_metadata.all_greedy
        temperature = None
        if probabilistic:
            temperature = sampling_metadata.temperature[:b].float()  # 0 (or ~0) = greedy row
        anchors = self.input_ids[: b * k : k].long()  # query slot 0 of each request: x_0
        out = sample_block(self.model, hidden_states.view(b, k, -1), anchors, temperature,
                           self._conf_temps[:k], want_probs=probabilistic,
                           target_vocab_size=self.vllm_config.model_config.get_vocab_size(),
                           positions=self.positions[: b * k].view(b, k),
                           graphs=self._block_graphs,
                           greedy_confidence=self._lookup_table is not None)
        self.last_confidences = None if out.confidence is None else out.confidence.float().cpu()
        self._greedy_conf = out.greedy_confidence
        self._row_sampled = None if sampling_metadata.all_greedy else \
            (sampling_metadata.temperature[:b] >= GREEDY_EPS).cpu().numpy()
        probs = None if out.probs is None else out.probs.flatten(0, 1)
        return out.tokens.flatten(), probs
