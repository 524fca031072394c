"""SGLang attention backend that runs the MLA target-verify step through ddtree_op.

`DDTreeTritonAttnBackend` is SGLang's `TritonAttnBackend` with one change: `forward_extend` in
`ForwardMode.TARGET_VERIFY` on an MLA model (576-wide keys, 512-wide values) writes the drafts'
latent rows through the pool's own `set_kv_buffer`, then attends with
`ddtree_op.sglang.target_verify_forward` over the metadata the Triton backend already built
(eager or CUDA-graph). The step's preparation (indices, mask, schedule) is made once per
forward, by its first layer, and every later layer runs the attention alone over it.
Everything else (prefill, decode, draft extend, non-MLA models, sliding window, context
parallelism, FP8 scales, logit capping, sinks) is SGLang's own code path.

Switch a server over with one import and one flag::

    import ddtree_op.integrations.sglang as ddtree_sglang
    ddtree_sglang.install()                # registers --attention-backend ddtree
    # ... launch SGLang with --attention-backend ddtree

`install(replace_triton=True)` also puts the class behind the name `triton`.

SGLang is imported when this module is imported, nowhere else in ddtree_op. Written against
sglang 0.5.23.
"""

from __future__ import annotations

from sglang.srt.configs.model_config import AttentionArch
from sglang.srt.layers.attention import attention_registry
from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
from sglang.srt.mem_cache.memory_pool import KVWriteLoc

from ddtree_op.contract import LATENT_DIM, QK_DIM
from ddtree_op.sglang import prepare_target_verify, target_verify_forward

BACKEND_NAME = "ddtree"


class DDTreeTritonAttnBackend(TritonAttnBackend):
    """`TritonAttnBackend` whose MLA TARGET_VERIFY attention is ddtree_op's tree-masked op."""

    # ddtree_op backend= for the op ("auto": sm90 on Hopper, Triton on other GPUs, the reference
    # on CPU). A class attribute so a deployment can pin it without subclassing again.
    ddtree_backend = "auto"

    def _routes_to_ddtree(self, layer, forward_batch, sinks, score_mod, aux_tensors) -> bool:
        return (
            self.use_mla
            and forward_batch.forward_mode.is_target_verify()
            and layer.qk_head_dim == QK_DIM
            and layer.v_head_dim == LATENT_DIM
            and sinks is None
            and score_mod is None
            and aux_tensors is None
            and layer.k_scale is None  # FP8 KV with a scale: SGLang's path
            and not layer.logit_cap
            and not layer.is_cross_attention
            and (layer.sliding_window_size is None or layer.sliding_window_size < 0)
            and self.dcp_size == 1
            and not self.enable_deterministic
            and self.dllm_attention is None
            and self.forward_metadata.custom_mask is not None
        )

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, sinks=None, score_mod=None,
                       aux_tensors=None):
        if not self._routes_to_ddtree(layer, forward_batch, sinks, score_mod, aux_tensors):
            return super().forward_extend(q, k, v, layer, forward_batch, save_kv_cache, sinks=sinks,
                                          score_mod=score_mod, aux_tensors=aux_tensors)
        if (k is None) != (v is None):
            raise ValueError("Both k and v should be None or not None")
        pool = self.token_to_kv_pool
        if save_kv_cache and k is not None:
            # The op reads the drafts' own rows from the pool, so they go in first, the same way
            # the parent backend writes them (one loc object carrying the batch's physical mark).
            loc_info = KVWriteLoc.for_batch(forward_batch, swa_loc=self.forward_metadata.swa_out_cache_loc)
            self._set_kv_buffer(forward_batch, layer, loc_info, k, v)
        meta = self.forward_metadata
        q = q.view(-1, layer.tp_q_head_num, layer.qk_head_dim)
        k_buffer = pool.get_key_buffer(layer.layer_id)
        indices = dict(qo_indptr=meta.qo_indptr, kv_indptr=meta.kv_indptr, kv_indices=meta.kv_indices,
                       custom_mask=meta.custom_mask, mask_indptr=meta.mask_indptr, out_cache_loc=forward_batch.out_cache_loc,
                       num_draft_tokens=meta.max_extend_len)
        out = getattr(forward_batch, "_attn_output", None)  # SGLang's shared output buffer, if any
        return target_verify_forward(q, k_buffer, v_buffer=pool.get_value_buffer(layer.layer_id), **indices,
                                     sm_scale=layer.scaling, o=out, backend=self.ddtree_backend,
                                     prepared=self._prepared_step(forward_batch, layer.layer_id, q, k_buffer, indices))

    def _prepared_step(self, forward_batch, layer_id, q, k_buffer, indices):
        """The step's preparation, made by its first layer and reused by the later ones: every
        layer of a forward attends over the same batch. It is kept on the forward batch (a new
        object each forward, so torch.compile's guards stay the same from one forward to the
        next), with the last layer id that used it: a layer id that does not exceed it starts a
        forward again (a CUDA-graph warm-up or capture runs the same batch object more than once),
        so no hook of the engine needs to reset it."""
        last = getattr(forward_batch, "_ddtree_prepared", None)
        if last is not None and layer_id > last[0] and last[1].num_tokens == q.shape[0]:
            prepared = last[1]
        else:
            prepared = prepare_target_verify(q, k_buffer, **indices)
        forward_batch._ddtree_prepared = (layer_id, prepared)
        return prepared


def create_ddtree_backend(runner):
    """`ATTENTION_BACKENDS` factory: the subclass for MLA models, SGLang's `triton` for others."""
    if runner.model_config.attention_arch != AttentionArch.MLA:
        return _ORIGINAL_TRITON(runner) if _ORIGINAL_TRITON is not None else TritonAttnBackend(runner)
    assert not runner.model_config.is_encoder_decoder, "Cross attention is not supported by the ddtree backend"
    return DDTreeTritonAttnBackend(runner)


_ORIGINAL_TRITON = attention_registry.ATTENTION_BACKENDS.get("triton")


def install(name: str = BACKEND_NAME, *, replace_triton: bool = False) -> None:
    """Registers the backend as `--attention-backend NAME` (and as `triton` when asked).

    Call it in the process that builds the model runner, before the server starts (for several
    scheduler processes, in a module they import, such as a plugin or sitecustomize).
    """
    from sglang.srt.arg_groups import choices

    attention_registry.ATTENTION_BACKENDS[name] = create_ddtree_backend
    if name not in choices.ATTENTION_BACKEND_CHOICES:
        choices.add_attention_backend_choices([name])
    if replace_triton:
        attention_registry.ATTENTION_BACKENDS["triton"] = create_ddtree_backend


def uninstall(name: str = BACKEND_NAME) -> None:
    """Undoes `install` (for tests)."""
    from sglang.srt.arg_groups import choices

    attention_registry.ATTENTION_BACKENDS.pop(name, None)
    if name in choices.ATTENTION_BACKEND_CHOICES:
        choices.ATTENTION_BACKEND_CHOICES.remove(name)
    if _ORIGINAL_TRITON is not None:
        attention_registry.ATTENTION_BACKENDS["triton"] = _ORIGINAL_TRITON
