"""A verify step through a real MLA model: transformers' DeepSeek-V3, tiny random config.

`TreeVerifier` runs the model's own layers (norms, projections, rotary embedding, MLP, head)
but replaces each attention with the absorbed form over a token-slot KV pool and
`ddtree_op.mla_tree_verify`: q_latent = q_nope · W_UK, one 576-wide row [latent ‖ rotated rope]
per token, output latent · W_UV. The prefix KV comes from an HF prefill (per-layer hidden
states); the drafts' KV is written into scattered slots first, as SGLang's set_kv_buffer does.
Nothing is downloaded: the weights are random and built here.
"""

from __future__ import annotations

import torch
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as hf_deepseek

from ddtree_op import mla_tree_verify


def tiny_deepseek_v3(seed: int = 0, heads: int = 4) -> DeepseekV3ForCausalLM:
    """MLA geometry of DeepSeek-V3 (kv_lora_rank 512, rope 64); everything else small; dense MLPs."""
    config = DeepseekV3Config(
        vocab_size=96, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
        num_hidden_layers=2, first_k_dense_replace=2, num_attention_heads=heads, num_key_value_heads=heads,
        q_lora_rank=48, kv_lora_rank=512, qk_nope_head_dim=32, qk_rope_head_dim=64, v_head_dim=32,
        n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1, max_position_embeddings=512,
        initializer_range=0.3, tie_word_embeddings=False, attn_implementation="eager",
    )
    torch.manual_seed(seed)
    return DeepseekV3ForCausalLM(config).eval()


class TreeVerifier(torch.nn.Module):
    def __init__(self, model: DeepseekV3ForCausalLM, num_slots: int, kv_dtype=torch.float16):
        super().__init__()
        self.model = model
        cfg = model.config
        self.heads, self.nope, self.v_dim = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.v_head_dim
        self.interleave = cfg.rope_interleave
        pool = torch.zeros(cfg.num_hidden_layers, num_slots, 1, 576, dtype=kv_dtype, device=model.device)
        self.register_buffer("kv_pool", pool)
        # Absorption: kv_b_proj = [W_UK; W_UV] per head, each acting on the 512-wide latent.
        for i, layer in enumerate(model.model.layers):
            w = layer.self_attn.kv_b_proj.weight.detach().view(self.heads, self.nope + self.v_dim, 512)
            self.register_buffer(f"w_uk_{i}", w[:, : self.nope].clone())
            self.register_buffer(f"w_uv_{i}", w[:, self.nope :].clone())

    def _rope(self, q_rot, k_rot, cos, sin):
        rope = hf_deepseek.apply_rotary_pos_emb_interleave if self.interleave else hf_deepseek.apply_rotary_pos_emb
        return rope(q_rot, k_rot, cos, sin)

    def _latents_and_queries(self, i, attn, normed, cos, sin):
        """KV rows [T, 576] and absorbed queries [T, H, 576] of the tokens in `normed` [1, T, hidden]."""
        tokens = normed.shape[1]
        kv_nope, k_rot = attn.kv_a_proj_with_mqa(normed).split([512, 64], dim=-1)
        kv_nope = attn.kv_a_layernorm(kv_nope)
        q = attn.q_b_proj(attn.q_a_layernorm(attn.q_a_proj(normed))).view(1, tokens, self.heads, -1).transpose(1, 2)
        q_nope, q_rot = q.split([self.nope, 64], dim=-1)  # [1, H, T, *]
        q_rot, k_rot = self._rope(q_rot, k_rot.view(1, 1, tokens, 64), cos, sin)
        rows = torch.cat([kv_nope[0], k_rot[0, 0]], dim=-1)
        q_latent = torch.einsum("htd,hdc->thc", q_nope[0], getattr(self, f"w_uk_{i}"))
        queries = torch.cat([q_latent, q_rot[0].transpose(0, 1)], dim=-1)
        return rows, queries

    @torch.no_grad()
    def prefill(self, prompt: torch.Tensor, slots: torch.Tensor) -> None:
        """Writes the prompt's KV rows (from an HF forward's per-layer hidden states) into `slots`."""
        hidden = self.model(prompt[None], output_hidden_states=True).hidden_states
        positions = torch.arange(prompt.numel(), device=prompt.device)[None]
        cos, sin = self.model.model.rotary_emb(hidden[0], positions)
        for i, layer in enumerate(self.model.model.layers):
            rows, _ = self._latents_and_queries(i, layer.self_attn, layer.input_layernorm(hidden[i]), cos, sin)
            self.kv_pool[i, slots, 0] = rows.to(self.kv_pool.dtype)

    @torch.no_grad()
    def forward(self, draft_ids, positions, qo_indptr, kv_indptr, kv_indices, out_cache_loc, tree_mask, mask_indptr, max_draft_len: int):
        """Logits [T, vocab] of every draft token of the batch (a tree verify step)."""
        hidden = self.model.model.embed_tokens(draft_ids)[None]
        cos, sin = self.model.model.rotary_emb(hidden, positions[None])
        for i, layer in enumerate(self.model.model.layers):
            attn = layer.self_attn
            rows, queries = self._latents_and_queries(i, attn, layer.input_layernorm(hidden), cos, sin)
            pool = self.kv_pool[i]
            pool[out_cache_loc, 0] = rows.to(pool.dtype)  # the drafts' KV, written before attention
            latent_out, _ = mla_tree_verify(
                queries.to(pool.dtype), pool, qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices,
                out_cache_loc=out_cache_loc, tree_mask=tree_mask, mask_indptr=mask_indptr, sm_scale=attn.scaling,
                max_draft_len=max_draft_len,
            )
            attn_out = torch.einsum("thc,hvc->thv", latent_out.float(), getattr(self, f"w_uv_{i}"))
            hidden = hidden + attn.o_proj(attn_out.reshape(1, draft_ids.numel(), -1))
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        return self.model.lm_head(self.model.model.norm(hidden))[0]
